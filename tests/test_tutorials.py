"""What users run first keeps working: every tutorial runs as a plain script, ``python -m cpd``
prints what the README promises, and the docs build with ``mkdocs build --strict``.

Invariant: each ``tutorials/*.py`` exits 0 when run as a script in a fresh process with small
sizes (``CPD_TUTORIAL_SMALL=1``) and a non-interactive matplotlib backend; the command-line
demo and format table run and show the key facts; the documentation has no broken link.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))
#: The first run in a fresh environment may compile the CPU extension (76 s on 2 idle cores, minutes on a busy machine).
TIMEOUT = 900


def _env(**extra: str) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


def _run(args: list[str], cwd: Path, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=_env(**extra), capture_output=True,
                          text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL)


def _report(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}\n--- stdout (tail)\n{p.stdout[-4000:]}\n--- stderr (tail)\n{p.stderr[-4000:]}"


@pytest.mark.parametrize("path", TUTORIALS or [None], ids=lambda p: p.name if p else "none-found")
def test_tutorial_runs_as_script(path: Path | None, tmp_path: Path) -> None:
    assert path is not None, f"no tutorials found in {ROOT / 'tutorials'}"
    p = _run([str(path)], tmp_path, CPD_TUTORIAL_SMALL="1", MPLBACKEND="Agg", CPD_TUTORIAL_OUT=str(tmp_path))
    assert p.returncode == 0, _report(p)
    for png in tmp_path.glob("*.png"):  # figures go to CPD_TUTORIAL_OUT and are real PNG files
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png.name
    if path.name == "01_casting.py":
        assert (tmp_path / "stochastic_rounding.png").is_file(), p.stdout[-2000:]


def test_tutorials_are_jupytext_percent_scripts() -> None:
    assert TUTORIALS, f"no tutorials found in {ROOT / 'tutorials'}"
    for path in TUTORIALS:
        text = path.read_text()
        assert "# %% [markdown]" in text and "\n# %%\n" in text, f"{path.name} is not in jupytext percent format"
        assert "what you will learn" in text.lower(), f"{path.name} does not open with what you will learn"


def test_cli_formats(tmp_path: Path) -> None:
    p = _run(["-m", "cpd", "formats"], tmp_path)
    assert p.returncode == 0, _report(p)
    lines = p.stdout.splitlines()
    e4m3fn = next((ln for ln in lines if " e4m3fn " in f" {ln} "), None)
    assert e4m3fn is not None and "448" in e4m3fn.split(), p.stdout
    for name, mx in (("e5m2", "57344"), ("e4m3", "240"), ("e2m1finite", "6"), ("e5m10", "65504")):
        row = next(ln.split() for ln in lines if name in ln.split())
        assert mx in row, (name, row)


def test_cli_demo_fast(tmp_path: Path) -> None:
    """The main job (APS training demo) runs in its --fast form: table columns, every
    configuration, the per-layer report and a PNG plot."""
    p = _run(["-m", "cpd", "demo", "--fast", "--out", str(tmp_path)], tmp_path, MPLBACKEND="Agg")
    assert p.returncode == 0, _report(p)
    out = p.stdout
    header = next(ln for ln in out.splitlines() if ln.startswith("config"))
    assert header.split() == ["config", "comm", "scaling", "test_acc", "test_loss", "train_loss", "skipped",
                              "seconds"], header
    for name in ("fp32", "e5m2 aps", "e5m2 none", "e4m3 aps", "e4m3 none", "e3m0 aps", "e3m0 none"):
        assert any(ln.startswith(name + " ") for ln in out.splitlines()), name
    assert "aps allreduce of 8 workers in e3m0 (ring)" in out and "conv1.weight" in out
    assert (tmp_path / "cpd_demo.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_demo_options_and_errors(tmp_path: Path, capsys) -> None:
    p = _run(["-m", "cpd", "demo", "--fast", "--epochs", "1", "--format", "e3m0", "--workers", "16",
              "--algorithm", "hierarchical", "--group-size", "4", "--no-plot"], tmp_path)
    assert p.returncode == 0, _report(p)
    assert "e3m0 aps" in p.stdout and "e4m3" not in p.stdout
    assert "allreduce of 16 workers in e3m0 (hierarchical, group_size=4)" in p.stdout
    code, err = _main_in_process(["demo", "--fast", "--algorithm", "hierarchical", "--group-size", "3"], capsys)
    assert code != 0 and "group-size" in err, err


def _main_in_process(argv: list[str], capsys) -> tuple[int, str]:
    """(exit status, stderr) of ``python -m cpd *argv`` run in this process: the argument errors,
    which end before any work (a subprocess would spend seconds importing torch for each); the
    successful runs above and below are real processes."""
    from cpd.__main__ import main

    try:
        code = main(argv)
    except SystemExit as e:  # as the interpreter ends on it: None is 0, a message is printed and 1
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    return code, capsys.readouterr().err


def test_cli_cast_demo(tmp_path: Path) -> None:
    p = _run(["-m", "cpd", "cast-demo", "--samples", "20000"], tmp_path)
    assert p.returncode == 0, _report(p)
    out = p.stdout
    for needle in ("e4m3fn", "448", "57344", "E2M1", "nearest", "stochastic", "toward_zero",
                   "0 01101 01 = 0.3125", "same seed again gives the same bits: True"):
        assert needle in out, f"{needle!r} missing from the demo output:\n{out}"
    # The double-rounding trap and the overflow are right in the worked example (e5m2 block).
    e5m2 = out[out.index("E5M2 (e5m2"):]
    assert next(ln for ln in e5m2.splitlines() if ln.strip().startswith("2^-17(1+2^-23)")).split()[1] == "2^-16"
    assert next(ln for ln in e5m2.splitlines() if ln.strip().startswith("65000")).split()[1] == "inf"
    mean = float(out.split("mean of the stochastic casts = ")[1].split()[0])
    assert abs(mean - 0.3) < 0.002


def test_cli_help_and_errors(tmp_path: Path, capsys) -> None:
    p = _run(["-m", "cpd", "--help"], tmp_path)
    assert p.returncode == 0 and all(c in p.stdout for c in ("demo", "cast-demo", "formats", "bench")), _report(p)
    code, err = _main_in_process(["formats", "--no-such-flag"], capsys)
    assert code == 2 and "--no-such-flag" in err, err


def test_main_returns_status(capsys: pytest.CaptureFixture) -> None:
    from cpd.__main__ import main

    assert main(["formats"]) == 0
    assert "e4m3fn" in capsys.readouterr().out


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="mkdocs is not installed (pip install torch==2.13.0 -e '.[docs]')")
def test_docs_build_strict(tmp_path: Path) -> None:
    site = tmp_path / "site"
    p = _run(["-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
             ROOT)
    assert p.returncode == 0, _report(p)
    for page in ("index.html", "formats/index.html", "casting/index.html", "api/index.html"):
        assert (site / page).is_file(), page


def test_readme_python_blocks_run():
    """Every ```python block of the README runs, in order, in one namespace."""
    import re

    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert blocks, "README.md has no python blocks"
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102


def test_cli_report(tmp_path: Path, capsys) -> None:
    import torch

    p = _run(["-m", "cpd", "report", "--format", "e5m2", "--workers", "64", "--algorithm", "hierarchical",
              "--group-size", "16", "--numel", "256"], tmp_path)
    assert p.returncode == 0, _report(p)
    assert "aps allreduce of 64 workers in e5m2 (hierarchical, group_size=16)" in p.stdout
    assert "conv1.weight" in p.stdout and "eq5_mean_rel" in p.stdout
    grads = {"layer.a": torch.randn(4, 10) * 1e-3, "layer.b": [torch.randn(3) for _ in range(4)]}
    torch.save(grads, tmp_path / "g.pt")
    p = _run(["-m", "cpd", "report", "--format", "e3m0", "--scaling", "none", "--grads", str(tmp_path / "g.pt")],
             tmp_path)
    assert p.returncode == 0, _report(p)
    assert "unscaled allreduce of 4 workers in e3m0" in p.stdout and "layer.b" in p.stdout
    code, err = _main_in_process(["report", "--algorithm", "hierarchical", "--group-size", "3"], capsys)
    assert code != 0 and "group_size" in err, err
