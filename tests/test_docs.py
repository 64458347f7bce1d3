"""The documentation says what is true now: the front page's code runs, every figure comes from a
benchmark record with its machine, date and command, and no guide page is a lab notebook.

Invariants: every ```python block of docs/index.md runs, in order, in a fresh process;
docs/figures.md and every ``<!-- figures:NAME -->`` block of docs/*.md and README.md are exactly
what ``python benchmarks/figures.py`` makes of ``benchmarks/results/*.json``; every record names
its machine, date and command; no page of the nav but the API reference is over 400 lines.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"
MAX_LINES = 400


def _load(name: str):
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def test_index_python_blocks_run(tmp_path: Path) -> None:
    """docs/index.md's code, block after block in one namespace, in a process of its own (one
    block starts a one-process gloo group)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "index.md").read_text(), re.S)
    assert len(blocks) >= 5, "docs/index.md should show the five uses with code"
    script = tmp_path / "index_blocks.py"
    script.write_text("\n".join(blocks))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    p = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=900, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    assert "0 01101 01 = 0.3125" in p.stdout


def test_figures_are_generated_from_the_records() -> None:
    figures = _load("figures")
    assert figures.main(["--check"]) == 0, "run: python benchmarks/figures.py"


def test_every_record_names_machine_date_command() -> None:
    paths = sorted((BENCH / "results").glob("*.json"))
    assert paths, "benchmarks/results/ holds no records"
    for path in paths:
        rec = json.loads(path.read_text())
        for key in ("bench", "machine", "date", "command", "columns", "rows"):
            assert rec.get(key), f"{path.name}: no {key}"
        assert path.stem.split("@")[0] == rec["bench"], path.name
        assert re.match(r"\d{4}-\d\d-\d\d", rec["date"]), f"{path.name}: date {rec['date']!r}"
        assert all(len(r) == len(rec["columns"]) for r in rec["rows"]), f"{path.name}: ragged rows"


def test_nav_pages_are_short() -> None:
    nav = re.findall(r"^\s+- [^:]+: (\S+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert "index.md" in nav and "figures.md" in nav
    long = {p: n for p in nav if p != "api.md" and (n := len((ROOT / "docs" / p).read_text().splitlines())) > MAX_LINES}
    assert not long, f"guide pages over {MAX_LINES} lines: {long}"


def test_no_round_logs_in_the_guide() -> None:
    for page in (ROOT / "docs").glob("*.md"):
        text = page.read_text()
        assert not re.search(r"^#+ .*\b(round|Round)\b.*\b(figures|kept for the record)", text, re.M), page.name
        assert not re.search(r"^#+ (First|Second|Third|Fourth|Fifth|Sixth|Seventh|Eighth) round", text, re.M), page.name


def test_table_format_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    fig = _load("_figures")
    text = fig.markdown(["op", "x copy"], [["cast", "1.10"], ["encode", "2.00"]])
    assert fig.parse_markdown("noise\n" + text + "\nmore") == (["op", "x copy"], [["cast", "1.10"], ["encode", "2.00"]])
    monkeypatch.setattr(fig, "RESULTS", tmp_path)
    monkeypatch.delenv("CPD_BENCH_RECORD", raising=False)
    t = fig.Table("bench_x", ["op", "x copy"], machine="CPU: test", setup="n = 4")
    t.row("cast", "1.10")
    assert t.save() is None and not list(tmp_path.iterdir())  # nothing written unless asked
    with pytest.raises(ValueError, match="cells"):
        t.row("only one")
    monkeypatch.setenv("CPD_BENCH_RECORD", "lvl-v3")
    path = t.save(notes="shared")
    rec = json.loads(path.read_text())
    assert path.name == "bench_x@lvl-v3.json" and rec["rows"] == [["cast", "1.10"]] and rec["machine"] == "CPU: test"
    assert rec["date"].endswith("UTC") and "python" in rec["command"] and rec["notes"] == "shared"
    monkeypatch.setenv("CPD_BENCH_RECORD", "../x")
    with pytest.raises(ValueError, match="CPD_BENCH_RECORD"):
        t.save()
    assert "| cast | 1.10 |" in capsys.readouterr().out
