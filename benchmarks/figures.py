"""Rebuild docs/figures.md, and every figures block of the docs and the README, from benchmarks/results/.

    python benchmarks/figures.py            # rewrite docs/figures.md and the marked blocks
    python benchmarks/figures.py --check    # exit 1 if any of them is not what the records give

Each benchmark writes its table with its machine, date and command to benchmarks/results/
(``CPD_BENCH_RECORD=1 python benchmarks/bench_cast.py ...``: see benchmarks/_figures.py). This
script collects the latest record of every benchmark and setting into docs/figures.md (those
labelled for another machine family into that family's page: OTHER_PAGES), and
replaces the text between ``<!-- figures:NAME -->`` and ``<!-- /figures:NAME -->`` in
docs/*.md and README.md by the record ``NAME`` (a file name in results/ without ``.json``),
or, for NAME ``summary``, by the headline table below. So no page quotes a figure by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
PAGE = ROOT / "docs" / "figures.md"
#: Records whose label starts with a key here go to that page instead of PAGE (one page per
#: machine family, so that each stays short enough to read), with a link from PAGE.
OTHER_PAGES = {"intel": ROOT / "docs" / "figures-intel.md"}
OTHER_TITLES = {"intel": "Figures: Intel Xeon (AVX-512 and AVX2 builds)"}

#: Section order and titles of the figures page (other benchmarks follow, by name).
SECTIONS = {
    "bench_cast": "Casts, encode, decode (`bench_cast.py`: time / `out.copy_(x)`)",
    "bench_mx": "Block formats: MX, NVFP4 (`bench_mx.py`: time / `out.copy_(x)`)",
    "bench_matmul": "Emulated GEMM (`bench_matmul.py`: time / `torch.mm`)",
    "bench_tensor_core": "Tensor-core models (`bench_tensor_core.py`: time / `torch.mm`)",
    "bench_allreduce": "Emulated allreduce (`bench_allreduce.py`: time / `torch.stack(ws).sum(0)`)",
    "bench_compressors": "Gradient compressors (`bench_compressors.py`: time / `out.copy_(x)`)",
    "bench_codec": "Wire codes: packing (`bench_codec.py`: time / a copy of the codes)",
    "bench_wire": "Low-bit DDP communication (`bench_wire.py`: step time / DDP float32)",
    "bench_gpu": "GPU (`bench_gpu.py`: CUDA events, time / the float32 baseline)",
    "bench_dispatch": "Host time per call (`bench_dispatch.py`: us per call / torch's own op)",
}
#: The README's headline figures: (record, the row's first cells, column, what it says).
HEADLINES = [
    ("bench_cast", "cast e5m2 nearest", "x copy", "cast to E5M2, round to nearest (one thread)"),
    ("bench_cast", "cast e5m2 stochastic", "x copy", "cast to E5M2, stochastic rounding (one thread)"),
    ("bench_cast@intel-avx512", "cast e5m2 nearest", "x copy", "same, AVX-512 build"),
    ("bench_cast@intel-avx512", "cast e5m2 stochastic", "x copy", "same, stochastic, AVX-512 build"),
    ("bench_mx", "cast MXFP8_E4M3 nearest, out=", "x copy", "MXFP8 cast (one thread)"),
    ("bench_mx", "encode MXFP4 -> packed codes + scales", "x copy", "MXFP4 encode (one thread)"),
    ("bench_matmul", "mul=None acc=FP32 (the default)", "x torch.mm", "`cpd.matmul` 512^3, the default (exact products, FP32 sums)"),
    ("bench_matmul", "mul=E5M2 acc=(5,10)", "x torch.mm", "`cpd.matmul` 512^3, E5M2 products, (5,10) sums"),
    ("bench_matmul", "mul=E5M2 acc=(6,7) kahan", "x torch.mm", "same into (6,7), Kahan"),
    ("bench_matmul@intel-avx512", "mul=None acc=FP32 (the default)", "x torch.mm", "`cpd.matmul` 512^3, the default, AVX-512 build"),
    ("bench_allreduce", "ring", "x stack().sum(0)", "ring allreduce, 64 workers x 2^20, E5M2"),
    ("bench_wire@intel-avx512", "10 Gbit/s, N = 2", "cpd e4m3", "DDP step, e4m3 codes, 10 Gbit/s, 2 ranks"),
    ("bench_wire@intel-avx512", "1 Gbit/s, N = 2", "packed 4-bit", "DDP step, packed 4-bit codes, 1 Gbit/s"),
    ("bench_gpu@h100", "cast nearest", "ratio", "cast of 2^26 floats, round to nearest, on the GPU"),
    ("bench_gpu@h100", ("matmul E5M2 -> (5,10)", "4096^3"), "ratio", "`cpd.matmul` 4096^3 on the GPU"),
]
MARK = re.compile(r"(<!-- figures:([\w.@+-]+) -->\n)(.*?)(<!-- /figures:\2 -->)", re.S)


def load() -> dict[str, dict]:
    recs = {}
    for path in sorted(RESULTS.glob("*.json")):
        rec = json.loads(path.read_text())
        for key in ("bench", "date", "machine", "command", "columns", "rows"):
            if not rec.get(key):
                raise ValueError(f"{path}: the record has no {key!r}")
        recs[path.stem] = rec
    return recs


def _table(rec: dict) -> str:
    cols = rec["columns"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] + ["---:"] * (len(cols) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rec["rows"]]
    return "\n".join(lines)


def block(rec: dict, full: bool = False) -> str:
    """A record as markdown: machine, date, command (and, in full, setup, load, notes), then its table."""
    head = [f"**Machine:** {rec['machine']}  ", f"**Date:** {rec['date']}, commit {rec.get('commit', '?')}  "]
    if rec.get("source", "measured") != "measured":
        head.append(f"**Recorded from:** {rec['source']}  ")
    if full and rec.get("load"):
        head.append(f"**Load average:** {rec['load']}  ")
    if full and rec.get("setup"):
        head.append(f"**Setup:** {rec['setup']}  ")
    head.append(f"**Command:** `{rec['command']}`")
    out = "\n".join(head) + "\n\n" + _table(rec) + "\n"
    if full and rec.get("notes"):
        out += "\n" + rec["notes"] + "\n"
    return out


def summary(recs: dict[str, dict]) -> str:
    lines = ["| figure | value | machine | date |", "|---|---:|---|---|"]
    for name, first, col, what in HEADLINES:
        rec = recs.get(name)
        if rec is None:
            continue
        lead = (first,) if isinstance(first, str) else tuple(first)
        row = next((r for r in rec["rows"] if tuple(r[:len(lead)]) == lead), None)
        if row is None or col not in rec["columns"]:
            continue
        if col.startswith("x "):
            unit = col
        elif "baseline" in rec["columns"]:
            unit = "x " + row[rec["columns"].index("baseline")]
        else:
            unit = "x DDP float32" if name.startswith("bench_wire") else "x baseline"
        value = row[rec["columns"].index(col)]
        machine = rec.get("short") or re.sub(r"^(CPU|GPU): ", "", rec["machine"].split(";")[0])
        lines.append(f"| {what} | {value} {unit} | {machine} | {rec['date'][:10]} |")
    return "\n".join(lines) + "\n"


def page_key(name: str, rec: dict) -> str:
    """The OTHER_PAGES key of a record's page ("" for PAGE)."""
    return next((k for k in OTHER_PAGES if rec.get("label", "").startswith(k)), "")


def sections(recs: dict[str, dict]) -> list[str]:
    """One section per benchmark, one table per record."""
    order = list(SECTIONS) + sorted({r["bench"] for r in recs.values()} - set(SECTIONS))
    out = []
    for bench in order:
        names = [n for n, r in recs.items() if r["bench"] == bench]
        if not names:
            continue
        out += [f"## {SECTIONS.get(bench, f'`{bench}.py`')}", ""]
        for name in sorted(names, key=lambda n: (recs[n].get("label", ""), n)):
            rec = recs[name]
            title = rec.get("title") or rec.get("short") or rec["machine"].split(";")[0]
            out += [f"### {title}", "", f"Record `benchmarks/results/{name}.json`.", "", block(rec, full=True)]
    return out


def other_page(key: str, recs: dict[str, dict]) -> str:
    out = [f"# {OTHER_TITLES[key]}", "",
           f"The records made on this machine family, generated as [Figures](figures.md) is (which",
           "explains how to add one, and holds the headlines of every machine).", ""]
    return "\n".join(out + sections(recs)).rstrip() + "\n"


def page(recs: dict[str, dict]) -> str:
    others = [f"[{OTHER_TITLES[k]}]({p.name})" for k, p in OTHER_PAGES.items()]
    out = ["# Figures", "",
           "Every speed figure of these docs, as the benchmarks last recorded it: one section per",
           "benchmark, one table per machine or setting, each with the machine, the date and the command.",
           "This page is generated: `python benchmarks/figures.py` rebuilds it (and the figures blocks of",
           "the other pages and of the README) from `benchmarks/results/*.json`; do not edit it by hand.",
           "",
           "To add or refresh a table, run the benchmark with `CPD_BENCH_RECORD=1` (or",
           "`CPD_BENCH_RECORD=<label>` for a second machine or setting, e.g. an ISA level), then",
           "`python benchmarks/figures.py`, and commit both. Ratios are measured side by side in one",
           "process, so they travel between machines better than absolute times; on a machine shared",
           "with other work, use `--threads 1 --clock cpu` where the benchmark has it. A record",
           "marked *recorded from* was measured by an earlier session on a machine not available now and",
           "transcribed with its machine and date. A commit marked `-dirty` had uncommitted changes (often",
           "the benchmark script itself) when the record was made. Other machines' tables are on their",
           "own pages: " + ", ".join(others) + ".", "", "## Headlines", "", summary(recs)]
    here = {n: r for n, r in recs.items() if not page_key(n, r)}
    return "\n".join(out + sections(here)).rstrip() + "\n"


def fill(text: str, recs: dict[str, dict]) -> str:
    def sub(m: re.Match) -> str:
        name = m.group(2)
        if name == "summary":
            body = summary(recs)
        elif name in recs:
            body = block(recs[name])
        else:
            raise ValueError(f"figures block {name!r}: no record benchmarks/results/{name}.json")
        return m.group(1) + body + m.group(4)

    return MARK.sub(sub, text)


def targets() -> list[Path]:
    return sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only check that every page is what the records give")
    args = p.parse_args(argv)
    recs = load()
    want = {PAGE: page(recs)}
    for key, path in OTHER_PAGES.items():
        want[path] = other_page(key, {n: r for n, r in recs.items() if page_key(n, r) == key})
    for path in targets():
        if path not in want and "<!-- figures:" in path.read_text():
            want[path] = fill(path.read_text(), recs)
    stale = [p for p, text in want.items() if not p.is_file() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"stale: {p.relative_to(ROOT)} (run python benchmarks/figures.py)")
        return 1 if stale else 0
    for p in stale:
        p.write_text(want[p])
        print(f"wrote {p.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
