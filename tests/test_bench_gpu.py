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
