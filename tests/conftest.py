"""Shared test configuration.

Invariants defended: the property-based tests are reproducible in CI (the "ci" hypothesis
profile is derandomized and has no deadline, since the first cast may build the extension), and
tests marked ``cuda`` are skipped, not failed, on machines without a GPU.

Profiles: "ci" (default, and whenever the CI environment variable is set) and "dev" (random,
more examples). Pick one with ``HYPOTHESIS_PROFILE=dev pytest ...``.
"""

import os
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `import oracle` from any working directory

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=200,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "dev",
    deadline=None,
    max_examples=1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "ci"))


#: The longest test files, longest first (minutes on 2 cores: ISA-level builds, real processes,
#: tutorials run as scripts, NVRTC compiles). With pytest-xdist (pyproject.toml: `-n 2 --dist
#: loadfile --no-loadscope-reorder`) each worker takes one of them at the start while the other
#: works through the rest, instead of a long file starting last.
FIRST = ("test_isa_levels.py", "test_distributed.py", "test_isa_compile.py", "test_tutorials.py", "test_cuda.py",
         "test_cuda_compile.py")


def pytest_sessionstart(session):
    """The CPU extension built once, before any test (issue 32): in the pytest-xdist controller,
    before the workers start (each worker's collection then loads the finished library, side by
    side under a shared flock), so that no two processes of the suite wait on one build and no
    timed test runs while one is under way. A plain ``-n 0`` run builds at its first collection,
    before its first test, as before. The ISA-level tests build other libraries, in folders of
    their own (no shared flock), at nice 10."""
    config = session.config
    if hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None):
        return  # a worker (the controller built it), or no workers
    from cpd import _cpu

    _cpu.extension()


def pytest_collection_modifyitems(config, items):
    order = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: order.get(item.path.name, len(FIRST)))  # stable: the order within is kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
