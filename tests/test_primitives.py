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


def test_scale_pow2_is_one_rounding_of_the_exact_product():
    """scale_pow2(x, s) against the float64 definition, (x.double() * 2**s).to(float32): values
    of every float32 binade (subnormals, the largest finite value, zeros, inf, NaN) at scales
    around float32's normal range, its edges and past them."""
    from cpd.primitives import scale_pow2

    g = torch.Generator().manual_seed(8)
    e = torch.randint(-149, 128, (4000,), generator=g).double()
    v = ((torch.rand(4000, generator=g, dtype=torch.float64) + 1.0) * 2.0 ** e).to(torch.float32)
    x = torch.cat([v, -v, torch.tensor([0.0, -0.0, 1e-45, 3.4028235e38, float("inf"), -float("inf"),
                                        float("nan")])])
    for s in (0, 1, -1, 20, -20, 125, 126, 127, 128, -125, -126, -127, -128, -149, -150, 149, 200, -300):
        got, want = scale_pow2(x, s), (x.double() * 2.0 ** s).to(torch.float32)
        assert got.dtype == torch.float32
        nan = torch.isnan(want)
        assert torch.equal(torch.isnan(got), nan), s
        assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32)), s


def test_all_finite_and_scale_pow2_refuse_what_they_cannot_read():
    from cpd.primitives import scale_pow2

    for bad in (torch.arange(3), [1.0, 2.0], torch.zeros(2, dtype=torch.bool)):
        with pytest.raises(TypeError, match="all_finite: x must be a floating-point"):
            all_finite(bad)
    x = torch.ones(3)
    for bad in (torch.ones(3, dtype=torch.float64), torch.arange(3), 1.0):
        with pytest.raises(TypeError, match="scale_pow2: x must be a float32"):
            scale_pow2(bad, 1)
    for s in (1.5, True, "2"):
        with pytest.raises(TypeError, match="scale_pow2: s must be an int"):
            scale_pow2(x, s)
    assert torch.equal(x, torch.ones(3))  # the input is left as it was
