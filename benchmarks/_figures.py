"""The benchmarks' one table format: printed as markdown, recorded as JSON for docs/figures.md.

A benchmark builds its table with :class:`Table` (each row printed as it is measured) or hands
a finished one to :func:`record`. Run with ``CPD_BENCH_RECORD=1`` and the table is also written
to ``benchmarks/results/<bench>.json`` -- with the machine, the UTC date, the command that made
it, the commit and the load average -- replacing the previous record of that benchmark;
``CPD_BENCH_RECORD=<label>`` writes ``<bench>@<label>.json`` instead (another ISA level,
another machine), so that one benchmark can keep one current record per setting;
``CPD_BENCH_NOTES="..."`` adds a note (e.g. that the machine was shared).
``python benchmarks/figures.py`` rebuilds docs/figures.md from every record.

Imported as ``from _figures import Table``: the scripts put this folder on ``sys.path`` first
(``python -m cpd bench`` and the tests load them by file path).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
#: Environment variables that change what a benchmark measures: kept in the recorded command.
ENV_IN_COMMAND = ("CPD_CPU_ARCH", "CPD_CPU_OPENMP", "CPD_NO_EXTENSION", "_CPD_CPU_CORE_ONLY", "CPD_WIRE_HOP",
                  "CPD_WIRE_SUBCHUNK", "CPD_GLOO_SCHED", "OMP_NUM_THREADS")


def markdown(columns: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def parse_markdown(text: str) -> tuple[list[str], list[list[str]]]:
    """(columns, rows) of the first markdown table in ``text`` (the inverse of :func:`markdown`)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    cells = [c for c in cells if not all(re.fullmatch(r":?-+:?", x) for x in c)]
    if not cells:
        raise ValueError("parse_markdown: no markdown table in the text")
    return cells[0], cells[1:]


def command() -> str:
    """The command line that is running, as a user would type it from the repository root."""
    env = " ".join(f"{k}={os.environ[k]}" for k in ENV_IN_COMMAND if k in os.environ)
    script = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else None
    try:
        shown = script.relative_to(ROOT).as_posix() if script else "?"
    except ValueError:
        shown = script.name if script else "?"
    args = " ".join(_quote(a) for a in sys.argv[1:])
    return " ".join(filter(None, [env, "python", shown, args]))


def _quote(arg: str) -> str:
    return arg if re.fullmatch(r"[\w./=:,+-]+", arg) else "'" + arg.replace("'", "'\\''") + "'"


def _commit() -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def record(bench: str, columns: list[str], rows: list[list[str]], *, machine: str, title: str = "",
           setup: str = "", notes: str = "") -> Path | None:
    """Write the table to benchmarks/results/ when ``CPD_BENCH_RECORD`` is set; return the path (else None).

    ``machine``: the CPU model and ISA level (or the GPU's name), as the benchmark printed it;
    ``setup``: sizes, threads, clock, reps; ``notes``: anything a reader needs (e.g. a shared
    machine), followed by ``CPD_BENCH_NOTES`` when set."""
    label = os.environ.get("CPD_BENCH_RECORD", "")
    if not label:
        return None
    if not re.fullmatch(r"[\w.+-]+", label):
        raise ValueError(f"CPD_BENCH_RECORD must be 1 or a label of letters, digits, '.', '+', '-'; got {label!r}")
    name = bench if label == "1" else f"{bench}@{label}"
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    rec = {"bench": bench, "label": "" if label == "1" else label, "title": title,
           "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine,
           "command": command(), "commit": _commit(), "setup": setup,
           "load": f"{load[0]:.1f} (1 min) on {os.cpu_count()} CPUs" if load else "",
           "notes": " ".join(filter(None, [notes, os.environ.get("CPD_BENCH_NOTES", "")])),
           "source": "measured", "columns": list(columns), "rows": [[str(c) for c in r] for r in rows]}
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(rec, indent=1, ensure_ascii=False) + "\n")
    shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    print(f"recorded: {shown} (python benchmarks/figures.py rebuilds docs/figures.md)")
    return path


class Table:
    """A table printed row by row as it is measured, then recorded (:func:`record`) by :meth:`save`."""

    def __init__(self, bench: str, columns: list[str], *, machine: str, title: str = "", setup: str = "") -> None:
        self.bench, self.columns, self.machine, self.title, self.setup = bench, list(columns), machine, title, setup
        self.rows: list[list[str]] = []
        print(machine)
        if setup:
            print(setup)
        print(markdown(self.columns, []), flush=True)

    def row(self, *cells) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"Table.row: {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([str(c) for c in cells])
        print("| " + " | ".join(self.rows[-1]) + " |", flush=True)

    def save(self, notes: str = "") -> Path | None:
        return record(self.bench, self.columns, self.rows, machine=self.machine, title=self.title,
                      setup=self.setup, notes=notes)
