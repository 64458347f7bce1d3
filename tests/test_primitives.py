"""cpd.primitives.all_finite against torch.isfinite(x).all() (the definition)."""

import pytest
import torch

from cpd.primitives import all_finite


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_all_finite_is_isfinite_all(dtype):
    g = torch.Generator().manual_seed(2)
    cases = [torch.zeros(0), torch.zeros(3, 0), torch.tensor(5.0), torch.randn(1000, generator=g),
             torch.randn(7, 300, generator=g).t()]  # a non-contiguous view
    for bad in (float("nan"), float("inf"), -float("inf")):
        for where in (0, 517, 999):
            x = torch.randn(1000, generator=g)
            x[where] = bad
            cases.append(x)
        y = torch.randn(4, 9, generator=g)
        y[3, 8] = bad
        cases.append(y)
    z = torch.randn(1000, generator=g)
    z[10], z[20] = float("inf"), -float("inf")  # both infinities, no NaN
    cases += [z, torch.full((5,), float("nan")), torch.tensor([1e38, 3e38])]
    for x in cases:
        x = x.to(dtype)
        assert all_finite(x) == bool(torch.isfinite(x).all()), (dtype, x.shape)
