#!/usr/bin/env bash
# The GPU checks of one device session, in one call (the device tool lends 15 minutes in all):
#
#   device run --timeout_s 540: bash benchmarks/gpu_session.sh
#
# On the lent machine (torch 2.11 + CUDA 13.0, nothing installable) from the repository root:
# builds the CPU extension (its C++ CUDA launches too), runs every cuda-marked test that the
# C++ launch path and the kernels touch, then the per-call host times and the GEMM / cast /
# transformer-step table, and the shared-memory bank conflicts of each kernel (ncu). Logs go to
# $OUT (at most 8 files come back); each step is limited so
# that a hang leaves time for the rest. `--quick` on bench_gpu keeps the whole under 9 minutes.
set -u
export PYTHONPATH=.
OUT=${OUT:-/tmp/cpd-gpu-session}
mkdir -p "$OUT"
{
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
  python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  time python -c "import torch, cpd; cpd.cast(torch.zeros(1), cpd.E5M2); print('extension ok')"
} > "$OUT/1_setup.log" 2>&1
# The C++ launch path first (issue 28), then the kernels' own tests (issue 27).
timeout 240 python -m pytest -q -p no:cacheprovider -o addopts="-ra" -n 4 --dist load -m cuda tests/test_dispatch.py tests/test_cuda.py \
  tests/test_device_paths.py tests/test_mx_kernels.py tests/test_tensor_core_amd_mx.py tests/test_fused_reduce.py \
  tests/test_fused_dot_tiled.py tests/test_mx_warp.py > "$OUT/2_pytest_cuda.log" 2>&1
timeout 90 python benchmarks/bench_dispatch.py --device cuda > "$OUT/3_bench_dispatch.log" 2>&1
timeout 150 python benchmarks/bench_gpu.py --quick > "$OUT/4_bench_gpu.log" 2>&1
# Shared-memory bank conflicts per kernel (Nsight Compute's counters; benchmarks/gpu_banks.py).
timeout 120 ncu --clock-control none --csv --metrics "$(python benchmarks/gpu_banks.py --metrics)" \
  python benchmarks/gpu_banks.py > "$OUT/5_ncu_banks.csv" 2> "$OUT/5_ncu_banks.err" &&
  python benchmarks/gpu_banks.py --report "$OUT/5_ncu_banks.csv" > "$OUT/5_banks.log" 2>&1
tail -n 3 "$OUT"/2_pytest_cuda.log
echo "logs in $OUT"
