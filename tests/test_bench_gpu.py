"""benchmarks/bench_gpu.py runs: without a GPU it says so and exits 0; its table prints ratios."""

import importlib.util
from pathlib import Path

import torch

SPEC = importlib.util.spec_from_file_location("bench_gpu", Path(__file__).resolve().parent.parent / "benchmarks" / "bench_gpu.py")
bench_gpu = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(bench_gpu)


def test_table_format():
    text = bench_gpu.table([("cast e5m2 nearest", "2^26", 0.0023, 0.002, "out.copy_(x)")])
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["operation", "size"] and set(lines[1]) <= {"-", " "}
    assert "1.15x" in lines[2] and "2.300 ms" in lines[2]


def test_runs_without_a_gpu(capsys):
    if torch.cuda.is_available():
        return  # measured by hand on a GPU: python benchmarks/bench_gpu.py
    assert bench_gpu.main(["--quick"]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out


SPEC_BANKS = importlib.util.spec_from_file_location(
    "gpu_banks", Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_banks.py")
gpu_banks = importlib.util.module_from_spec(SPEC_BANKS)
SPEC_BANKS.loader.exec_module(gpu_banks)


def test_bank_report_reads_ncu_csv(tmp_path, capsys):
    """gpu_banks.py --report sums ncu's --csv rows per cpd kernel (other kernels and ncu's own
    ==PROF== lines are skipped) and prints the largest share of conflict wavefronts."""
    head = '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"\n'
    rows = []
    for i, (name, ld, cld, st, cst) in enumerate([("cpd_matmul_chain", "1,000", "0", "200", "0"),
                                                  ("cpd_matmul_chain", "1,000", "0", "200", "0"),
                                                  ("cpd_fused_dot_tiled_l32", "400", "100", "100", "0"),
                                                  ("vectorized_elementwise_kernel", "9", "9", "9", "9")]):
        for metric, value in zip(gpu_banks.METRICS.split(","), (ld, st, cld, cst)):
            rows.append(f'"{i}","{name}","Command line profiler metrics","{metric}","","{value}"\n')
    path = tmp_path / "banks.csv"
    path.write_text("==PROF== Connected to process\n" + head + "".join(rows))
    assert gpu_banks.main(["--report", str(path)]) == 0
    out = capsys.readouterr().out
    chain = next(line for line in out.splitlines() if line.startswith("cpd_matmul_chain"))
    assert chain.split()[1:] == ["2000", "0", "400", "0"]
    assert "vectorized" not in out and "largest share of conflict wavefronts: 20.0%" in out


def test_bank_workload_without_a_gpu(capsys):
    if torch.cuda.is_available():
        return  # profiled on a GPU by benchmarks/gpu_session.sh
    assert gpu_banks.main([]) == 0
    assert "no CUDA GPU" in capsys.readouterr().out
