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


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
