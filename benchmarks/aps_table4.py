"""Slow check of the APS paper's Table-4 shape at small scale (the default ``python -m cpd demo``).

Runs fp32, e5m2/e4m3/e3m0 with APS and unscaled (8 workers, ring, 40 epochs on the 8x8 digits;
a few minutes on 2 cores) and asserts:

* APS in 8 bits (e5m2, e4m3) is within 1.5 points of fp32 test accuracy;
* APS in (3, 0) learns: within 8 points of fp32;
* unscaled (3, 0) fails to learn: below 30% (chance is 10%).

Usage: python benchmarks/aps_table4.py [--epochs 40] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys

import cpd
from cpd.demo import load_digits_tensors, results_table, run_config


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    data = load_digits_tensors(a.seed)
    res = {"fp32": run_config("fp32", cpd.FP32, None, data, epochs=a.epochs, seed=a.seed)}
    for f in (cpd.E5M2, cpd.E4M3, cpd.FloatFormat(3, 0)):
        for s in ("aps", None):
            name = f"{f.name} {s or 'none'}"
            res[name] = run_config(name, f, s, data, epochs=a.epochs, seed=a.seed)
            print(name, f"{100 * res[name]['test_acc']:.2f}%", flush=True)
    print(results_table(list(res.values())))
    ref = res["fp32"]["test_acc"]
    checks = {
        "e5m2 aps within 1.5 points of fp32": res["e5m2 aps"]["test_acc"] >= ref - 0.015,
        "e4m3 aps within 1.5 points of fp32": res["e4m3 aps"]["test_acc"] >= ref - 0.015,
        "e3m0 aps within 8 points of fp32": res["e3m0 aps"]["test_acc"] >= ref - 0.08,
        "e3m0 none below 30%": res["e3m0 none"]["test_acc"] < 0.30,
    }
    for k, v in checks.items():
        print(("PASS " if v else "FAIL ") + k)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
