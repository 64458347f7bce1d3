"""The emulated allreduce in one launch (cuda/kernels/cast.cu ``cpd_reduce_rows``, cpd/_fused_reduce.py).

Invariants defended, through the host shim (the CUDA kernel run bit for bit on the CPU):
* every order the kernel runs (ring, sequential, hierarchical at every group size), plain and
  Kahan, in every rounding mode, gives the bits of the hop-by-hop CPU path, and in the
  deterministic modes the exact oracle's (:func:`cpd.reference.allreduce`, rational arithmetic);
* ragged chunks (n not a multiple of W, n < W), one worker, non-finite inputs, signed zeros,
  overflow with and without ``saturate``, ``inputs_in_fmt``, block formats;
* stochastic rounding: the same bits for the same generator state, and the generator left where
  the hop-by-hop path leaves it (the pairs are drawn up front in that path's order);
* the kernel really runs (one launch; the hop-by-hop path is not taken); the tree order
  (``cpd_reduce_tree``) too, at every worker count up to 33 (powers of two and between), and more
  than TREE_MAX_WORKERS workers keep the hop-by-hop path.
"""

import itertools

import pytest
import torch

import cpd
import cpd.reference
from cpd import _fused_reduce, _impl, _shim

pytestmark = pytest.mark.skipif(not _shim.available(), reason="no host C++ compiler for the shim")


def bits(t):
    return t.contiguous().view(torch.int32)


def same(a, b) -> bool:
    """The same bits, any NaN equal to any NaN: IEEE 754 leaves the sign and payload of an
    operation's NaN unspecified, and cpd's own CPU paths differ there (the scalar and the vector
    adds of two NaNs keep different operands' signs)."""
    return a.shape == b.shape and bool(((bits(a) == bits(b)) | (torch.isnan(a) & torch.isnan(b))).all())


def _rows(w, n, seed=0, specials=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(w, n, generator=g) * torch.logspace(-6, 6, n).to(torch.float32)
    x[:, ::7] = -x[:, ::7]
    if specials and n >= 6:
        x[0, 1], x[w - 1, 2], x[w // 2, 3] = float("inf"), float("-inf"), float("nan")
        x[:, 4] = -0.0
        x[:, 5] = 3.0e38
    return x


def _launches():
    """Count cpd_reduce_rows launches (and check that nothing else reduced)."""
    seen = []
    orig = _impl.Kernels.reduce_rows

    def spy(self, *a):
        seen.append(a[2])  # w
        return orig(self, *a)

    return seen, orig, spy


def _both(x, fmt, kw, stochastic):
    """(hop-by-hop CPU result, fused shim result, generator draws after each)."""
    def run():
        g = torch.Generator().manual_seed(11) if stochastic else None
        y = cpd.allreduce(x, fmt, generator=g, **kw)
        return y, (torch.randint(0, 2**31, (4,), generator=g) if g is not None else None)

    want, after_want = run()
    seen, orig, spy = _launches()
    _impl.Kernels.reduce_rows = spy
    try:
        with _shim.on_host(threads=32, max_blocks=3):
            got, after_got = run()
    finally:
        _impl.Kernels.reduce_rows = orig
    return want, got, after_want, after_got, seen


ORDERS = [dict(algorithm="ring"), dict(algorithm="sequential"), dict(algorithm="hierarchical", group_size=1),
          dict(algorithm="hierarchical", group_size=2), dict(algorithm="hierarchical", group_size=3),
          dict(algorithm="hierarchical", group_size=6), dict(algorithm="tree")]


@pytest.mark.parametrize("order", ORDERS, ids=lambda o: "-".join(str(v) for v in o.values()))
@pytest.mark.parametrize("kahan", [False, True], ids=["plain", "kahan"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "toward_zero", "up", "down"])
def test_every_order_and_mode_matches_the_hop_by_hop_path(order, kahan, rounding):
    for fmt, (w, n) in [(cpd.E5M2, (6, 41)), (cpd.BF16, (6, 5))]:
        x = _rows(w, n, seed=w + n, specials=True)
        kw = dict(order, kahan=kahan, rounding=rounding)
        want, got, after_want, after_got, seen = _both(x, fmt, kw, rounding == "stochastic")
        assert seen == [w], "the fused kernel did not run (or ran more than once)"
        assert same(got, want), (fmt.name, w, n)
        if rounding == "stochastic":
            assert torch.equal(after_got, after_want), "the generator was not left where the hop-by-hop path leaves it"


@pytest.mark.parametrize("fmt", [cpd.E4M3, cpd.E5M2, cpd.E4M3FN, cpd.E2M1, cpd.FP16, cpd.FloatFormat(3, 2)],
                         ids=lambda f: f.name)
@pytest.mark.parametrize("rounding", ["nearest", "toward_zero", "up", "down"])
def test_deterministic_modes_equal_the_exact_oracle(fmt, rounding):
    w, n = 5, 23
    x = _rows(w, n, seed=3) * 0.05
    for kw in ORDERS[:2] + [dict(algorithm="hierarchical", group_size=5), dict(algorithm="tree")]:
        for kahan, saturate in itertools.product([False, True], [False, True]):
            args = dict(kw, kahan=kahan, rounding=rounding, saturate=saturate)
            with _shim.on_host(threads=16, max_blocks=2):
                got = cpd.allreduce(x, fmt, **args)
            want = torch.tensor(cpd.reference.allreduce(x.tolist(), fmt, **args), dtype=torch.float32)
            assert same(got, want), (kw, kahan, saturate)


@pytest.mark.parametrize("w,n", [(1, 7), (4, 1), (4, 3), (7, 7), (3, 1000)])
def test_ragged_chunks_one_worker_and_inputs_in_fmt(w, n):
    x = _rows(w, n, seed=n)
    for inputs_in_fmt in (False, True):
        xin = cpd.cast(x, cpd.E5M2) if inputs_in_fmt else x
        for kahan in (False, True):
            want, got, *_ = _both(xin, cpd.E5M2, dict(kahan=kahan, inputs_in_fmt=inputs_in_fmt), False)
            assert same(got, want)


def test_signed_zeros_survive():
    x = torch.full((4, 8), -0.0)
    for rounding in ("nearest", "down"):
        want, got, *_ = _both(x, cpd.E4M3, dict(rounding=rounding, kahan=True), False)
        assert same(got, want) and bool(torch.signbit(got).all())


def test_block_formats_run_the_fused_reduction():
    x = _rows(4, 64, seed=9) * 1e-3
    want, got, _, _, seen = _both(x, cpd.mx.MXFP8_E4M3, dict(algorithm="ring"), False)
    assert seen == [4] and same(got, want)


@pytest.mark.parametrize("w", [1, 2, 3, 5, 7, 8, 9, 12, 16, 17, 31, 33])
@pytest.mark.parametrize("kahan", [False, True], ids=["plain", "kahan"])
def test_the_tree_at_every_worker_count(w, kahan):
    """The tree's stack walk against the level-by-level path: powers of two, one more and one less
    (the partial nodes of the last rows), stochastic words and the generator's state included."""
    x = _rows(w, 37, seed=w, specials=True)
    for rounding in ("nearest", "stochastic"):
        want, got, after_want, after_got, seen = _both(x, cpd.E5M2, dict(algorithm="tree", kahan=kahan,
                                                                          rounding=rounding), rounding == "stochastic")
        assert seen == [w] and same(got, want), (w, rounding)
        if rounding == "stochastic":
            assert torch.equal(after_got, after_want)


def test_more_workers_than_the_tree_stack_keep_the_hop_by_hop_path():
    assert _fused_reduce.plan("tree", _fused_reduce.TREE_MAX_WORKERS, None, False) == (0, False)
    assert _fused_reduce.plan("tree", _fused_reduce.TREE_MAX_WORKERS + 1, None, False) is None


def test_the_seed_count_is_what_the_hop_by_hop_path_draws():
    """seed_pairs against counting torch.randint calls on the generator of the hop-by-hop path."""
    for w, kw in [(6, dict(algorithm="ring")), (6, dict(algorithm="sequential")),
                  (6, dict(algorithm="hierarchical", group_size=2)), (6, dict(algorithm="hierarchical", group_size=1)),
                  (8, dict(algorithm="hierarchical", group_size=4)), (6, dict(algorithm="tree")),
                  (8, dict(algorithm="tree")), (9, dict(algorithm="tree")), (1, dict(algorithm="tree"))]:
        for kahan, inputs_in_fmt in itertools.product([False, True], [False, True]):
            g = torch.Generator().manual_seed(0)
            cpd.allreduce(torch.zeros(w, 3), cpd.E5M2, rounding="stochastic", generator=g, kahan=kahan,
                          inputs_in_fmt=inputs_in_fmt, **kw)
            ref = torch.Generator().manual_seed(0)
            k, lc = _fused_reduce.plan(kw["algorithm"], w, kw.get("group_size"), kahan)
            for _ in range(_fused_reduce.seed_pairs(w, k, kahan, lc, not inputs_in_fmt)):
                torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, generator=ref)
            assert torch.equal(g.get_state(), ref.get_state()), (w, kw, kahan, inputs_in_fmt)


def test_the_plan_of_each_order():
    assert _fused_reduce.plan("ring", 8, None, True) == (1, False)
    assert _fused_reduce.plan("sequential", 8, None, True) == (8, False)
    assert _fused_reduce.plan("hierarchical", 8, 2, True) == (2, True)
    assert _fused_reduce.plan("hierarchical", 8, 2, False) == (2, False)
    assert _fused_reduce.plan("tree", 8, None, True) == (0, True)
    assert _fused_reduce.plan("recursive_doubling", 8, None, False) is None
    assert _fused_reduce.seed_pairs(8, 2, True, True, True) == 1 + 1 * 4 + 3 * 5
    assert _fused_reduce.seed_pairs(8, 1, False, False, False) == 7


@pytest.mark.cuda
@pytest.mark.parametrize("order", ORDERS[:4] + ORDERS[-1:], ids=lambda o: "-".join(str(v) for v in o.values()))
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "down"])
def test_on_a_gpu_the_launch_gives_the_cpu_bits(order, rounding):
    """On a GPU, cpd_reduce_rows against the CPU's hop-by-hop path (12 workers, ragged chunks, non-finite inputs)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = _rows(12, 4099, seed=2, specials=True)
    for kahan in (False, True):
        kw = dict(order, kahan=kahan, rounding=rounding)
        gens = [torch.Generator().manual_seed(4) if rounding == "stochastic" else None for _ in range(2)]
        want = cpd.allreduce(x, cpd.E5M2, generator=gens[0], **kw)
        got = cpd.allreduce(x.cuda(), cpd.E5M2, generator=gens[1], **kw)
        assert got.is_cuda and same(got.cpu(), want), kw
