"""The real-process harness (tests/ranks.py) counts no build against a hang deadline, and still
catches a hang (issue 32: three ranks sat behind another process's build of the CPU extension
and a 120 s deadline ran out with nothing hung).

Invariants defended:
* a build held while a group starts (the extension folder's flock taken by this test, as a
  building process holds it): the ranks wait for it in their set-up, and the group then passes,
  though the wait was longer than its deadline;
* a set-up that never ends (the flock kept) fails after the set-up limit, naming the ranks not
  ready and their step;
* a rank made to hang on purpose fails the group within its deadline, naming the rank and the
  step it reported, and the ranks that finished are not named.

The groups load a copy of the built library from a folder of the test's own
(``TORCH_EXTENSIONS_DIR``, inherited by the ranks): the flock taken here holds up no other test.
Seconds, not minutes: two ranks, a tiny exchange.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import ranks
import torch

import cpd
from cpd import _cpu

fcntl = pytest.importorskip("fcntl", reason="the build's flock is POSIX")

#: The deadline of the tiny exchange below (init_process_group, one all_reduce, one cast).
DEADLINE = 6.0


def job_tiny(rank: int, world: int, hang_rank: int | None = None) -> dict:
    import torch.distributed as dist

    ranks.step("all_reduce")
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    if rank == hang_rank:
        ranks.step("hanging on purpose")
        time.sleep(3600)
    return {"sum": t.tolist(), "cast": cpd.cast(torch.tensor([0.3]), "e4m3").item(),
            "library": _cpu.extension().__file__}


@pytest.fixture
def library_folder(tmp_path, monkeypatch):
    """A copy of the built library in an extension folder of this test's own (the ranks' one);
    the path of that library's flock file."""
    ext = _cpu.extension()
    if ext is None or not getattr(ext, "__file__", None):
        pytest.skip("needs the built CPU extension")
    name = Path(ext.__file__).name.split(".")[0]
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    folder = _cpu._build_dir(name)
    folder.mkdir(parents=True)
    shutil.copy2(ext.__file__, folder / Path(ext.__file__).name)
    return folder


def _hold(folder: Path) -> int:
    """Take the folder's flock as a building process does; the descriptor (closing it releases)."""
    fd = os.open(folder / "cpd.flock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_held_build_is_waited_for_outside_the_deadline(library_folder, tmp_path, capfd):
    fd = _hold(library_folder)
    loading = set()
    released = threading.Event()

    def release_later():  # the "build" ends DEADLINE + 2 s after both ranks started loading
        time.sleep(DEADLINE + 2)
        fcntl.flock(fd, fcntl.LOCK_UN)
        released.set()

    def watch(rank, kind, text):
        if kind == "step" and text.startswith("set-up") and len(loading) < 2:
            loading.add(rank)
            if len(loading) == 2:
                threading.Thread(target=release_later, daemon=True).start()

    t0 = time.monotonic()
    try:
        res = ranks.spawn(job_tiny, 2, tmp_path / "held", name="tiny", deadline=DEADLINE, watch=watch)
    finally:
        os.close(fd)
    assert released.is_set() and time.monotonic() - t0 > DEADLINE + 2
    err = capfd.readouterr().err
    assert err.count("waiting for another process that is building cpd's CPU extension") == 2, err[-2000:]
    for r in res:
        assert r["sum"] == [3.0, 3.0, 3.0] and r["cast"] == 0.3125
        assert Path(r["library"]).parent == library_folder  # the ranks loaded the held folder's library


def test_a_set_up_that_never_ends_fails_naming_the_ranks(library_folder, tmp_path):
    fd = _hold(library_folder)
    try:
        with pytest.raises(AssertionError, match=r"tiny \(W=2\): not every rank was ready after 3\.0 s of set-up.*"
                                                 r"rank 0 \(in step ['\"].*['\"]\), rank 1 \(in step"):
            ranks.spawn(job_tiny, 2, tmp_path / "never", name="tiny", setup_limit=3.0)
    finally:
        os.close(fd)


def test_a_hanging_rank_fails_within_the_deadline_naming_it_and_its_step(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(AssertionError) as info:
        ranks.spawn(job_tiny, 2, tmp_path / "hang", 1, name="tiny", deadline=DEADLINE)
    msg = str(info.value)
    assert f"tiny (W=2) did not finish within {DEADLINE} s of the exchange" in msg, msg
    assert "still running: rank 1 (in step 'hanging on purpose')" in msg and "rank 0" not in msg, msg
    setup = float(msg.split("set-up took ")[1].split(" s")[0])
    assert time.monotonic() - t0 < setup + DEADLINE + 15, msg  # killed at the deadline (and joined)
