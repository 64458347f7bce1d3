"""cpd.mx's CUDA kernels (cuda/kernels/mx.cu: a group of a warp's lanes per block, shuffle
reductions and shuffle-packed code bytes), run on the host by the shim, against the CPU kernels
(cuda/cpu/mx.cpp, tested against the exact oracle tests/mx_oracle.py in tests/test_mx_kernels.py).

Invariants defended (no GPU needed):
* cast, encode (packed and not) and decode give the CPU's bits and bytes for every preset of the
  MX/NVFP4 family and block sizes that map to every group width (1, 2, 4, 8, 16, 32 lanes, lanes
  idle past an odd block, blocks of more than 32 elements walked in chunks), every scale rule,
  4-bit, 6-bit and 8-bit codes (the kernels' pack 4 / 6 and one code per byte, the wrapper's
  packing of odd blocks), every rounding mode, stochastic included (the same Philox words per
  element, so the same bits for the same generator: drawn per element, or -- blocks of 4, 8, 16,
  32 -- one Philox block per lane and batch, handed to the elements by shuffles);
* ragged rows (n not a multiple of the block, n below one block), blocks holding NaN, infinities,
  only zeros, only subnormals, float32's largest values, and values that underflow once scaled;
* odd launch geometries: thread blocks of 1 (raised to one whole group), 33 (a partial warp), 48
  and 256 threads, capped grids (the grid-stride loop over batches of blocks), several rows per
  batch (rows shorter than a batch);
* on a GPU (``cuda``-marked), the hardware's warps give the same bits.
"""

from __future__ import annotations

import math

import pytest
import torch

import cpd
from cpd import _cpu, _shim, mx

pytestmark = [pytest.mark.skipif(not _shim.available(), reason="no host C++ compiler for the shim"),
              pytest.mark.skipif(_cpu.extension() is None, reason="the CPU extension is not built")]

B = mx.BlockFormat
FORMATS = list(mx.PRESETS.values()) + [
    B(cpd.E2M1, 1), B(cpd.E2M1, 2, scale_rule="ceil"), B(cpd.E4M3FN, 3, scale_rule="even"),
    B(cpd.E2M3, 4, scale_rule="ceil"), B(cpd.E2M1, 5, scale_rule="even"), B(cpd.E3M2, 8, scale_rule="even"),
    B(cpd.E2M1, 12, scale=cpd.E4M3FN, scale_rule="amax", tensor_scale=True), B("int8", 20, scale_rule="ceil"),
    B(cpd.E2M3, 24), B(cpd.E5M2, 33, scale_rule="ceil"), B(cpd.E2M1, 40, scale_rule="amax", scale=cpd.E4M3FN),
    B(cpd.E3M2, 64), B(cpd.E4M3FN, 100, scale_rule="even", axis=0)]
MODES = [m.value for m in cpd.Rounding]
GEOMETRIES = [(33, 3), (1, 2), (48, None), (256, 1)]


def blocks_data(fmt, seed: int) -> torch.Tensor:
    """Rows along fmt's axis of a ragged length (3.5 blocks plus one), with special blocks."""
    bs = fmt.block_size
    n = 3 * bs + (bs + 1) // 2 + 1 if bs > 1 else 7
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(9, n, generator=g) * torch.exp2(torch.randint(-20, 20, (9, n), generator=g).float())
    x[1, bs // 2] = math.nan                                        # a NaN block
    x[2, min(bs, n - 1)], x[2, -1] = math.inf, -math.inf            # inf blocks (the last one ragged)
    x[3, :] = 0.0
    x[3, 1::3] = -0.0                                               # zeros only
    x[4] = torch.randn(n, generator=g) * 1e-40                      # subnormals only
    x[5] = (torch.rand(n, generator=g) * 2 - 1) * 3.4e38            # float32's largest
    x[6, 0::2], x[6, 1::2] = 3e-39, 2e30                            # products that underflow: the exact redo
    x[7, :] = torch.tensor([6.0, -0.25, 0.75, 5.0, -3.5, 1.25]).repeat(n)[:n] * 2.0 ** 5  # on the grid, ties
    return x if fmt.axis % 2 == 1 else x.t().contiguous()


def _bits(t):
    return t.contiguous().view(torch.int32)


def _run(x, fmt, mode, seed):
    gen = (lambda: torch.Generator().manual_seed(seed)) if mode == "stochastic" else (lambda: None)  # noqa: E731
    y = mx.cast(x, fmt, mode, generator=gen())
    encs = [mx.encode(x, fmt, mode, pack=p, generator=gen()) for p in (True, False)]
    return y, encs, [mx.decode(e) for e in encs]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_warp_kernels_on_the_shim_match_the_cpu(fmt):
    x = blocks_data(fmt, seed=fmt.block_size)
    want = {mode: _run(x, fmt, mode, 11) for mode in MODES}
    for i, (threads, max_blocks) in enumerate(GEOMETRIES):
        modes = MODES if i == 0 else ["nearest", "stochastic"]
        with _shim.on_host(threads=threads, max_blocks=max_blocks):
            for mode in modes:
                y, encs, decs = _run(x, fmt, mode, 11)
                wy, wencs, wdecs = want[mode]
                where = (fmt.name, mode, threads, max_blocks)
                assert torch.equal(_bits(y), _bits(wy)), where
                for e, we, d, wd in zip(encs, wencs, decs, wdecs):
                    assert torch.equal(e.codes, we.codes) and torch.equal(e.scales, we.scales), where
                    assert torch.equal(_bits(d), _bits(wd)), where


@pytest.mark.parametrize("fmt", [mx.MXFP8_E4M3, mx.MXFP4, mx.MXFP6_E2M3, mx.NVFP4, B(cpd.E2M1, 6)],
                         ids=lambda f: f.name)
@pytest.mark.parametrize("shape", [(1, 5), (37, 3), (2, 70), (1, 1), (6, 0)])
def test_short_and_many_rows(fmt, shape):
    """Rows shorter than a block and than a batch of blocks (a batch spans rows), one element."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape))) * 50
    want = _run(x, fmt, "stochastic", 3)
    with _shim.on_host(threads=64, max_blocks=2):
        got = _run(x, fmt, "stochastic", 3)
    assert torch.equal(_bits(got[0]), _bits(want[0]))
    for e, we in zip(got[1], want[1]):
        assert torch.equal(e.codes, we.codes) and torch.equal(e.scales, we.scales)
    for d, wd in zip(got[2], want[2]):
        assert torch.equal(_bits(d), _bits(wd))


def test_launch_geometry():
    """The lanes per block (the kernel's mx_lanes) and a thread block of at least one whole group
    (cuda/cpu/launch.cpp mx_launch_shape: {grid, threads, lanes})."""
    shape = _cpu.extension().mx_launch_shape
    assert [shape(1, b, 64, 0)[2] for b in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 1000)] == \
        [1, 2, 4, 4, 8, 8, 16, 16, 32, 32, 32, 32, 32]
    assert shape(100, 32, 1, 0) == [25, 32, 32]    # 1 thread raised to one group; 4 blocks a group
    assert shape(100, 16, 64, 0) == [7, 64, 16]    # 4 groups a thread block: 25 batches in 7
    assert shape(100, 16, 64, 3) == [3, 64, 16]    # capped grid
    assert shape(0, 5, 33, 0) == [1, 33, 8]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_warp_kernels_on_a_gpu_match_the_cpu(fmt):
    """The real warps (shuffles in hardware, every launch of the device's geometry) give the CPU's
    bits: the shim's cases, and a tensor of many thread blocks (grid-stride batches)."""
    big = torch.randn(300, 4 * fmt.block_size + 3, generator=torch.Generator().manual_seed(5)) * 1e3
    for x in (blocks_data(fmt, seed=fmt.block_size), big if fmt.axis % 2 == 1 else big.t().contiguous()):
        for mode in MODES:  # CPU generators for both: the same (seed, offset) pairs (cpd.ops.draw_seed)
            wy, wencs, wdecs = _run(x, fmt, mode, 11)
            y, encs, decs = _run(x.cuda(), fmt, mode, 11)
            assert torch.equal(_bits(y.cpu()), _bits(wy)), (fmt.name, mode)
            for e, we, d, wd in zip(encs, wencs, decs, wdecs):
                assert torch.equal(e.codes.cpu(), we.codes) and torch.equal(e.scales.cpu(), we.scales), (fmt.name, mode)
                # a NaN block decodes as P * NaN: the GPU's multiplier gives its one canonical NaN
                d, nan = d.cpu(), wd.isnan()
                assert torch.equal(d.isnan(), nan) and torch.equal(_bits(d)[~nan], _bits(wd)[~nan]), (fmt.name, mode)


def test_a_generator_that_is_not_one_is_refused():
    with pytest.raises(TypeError, match="generator must be a torch.Generator"):
        mx.cast(torch.ones(32), mx.MXFP8_E4M3, "stochastic", generator=3)


@pytest.mark.cuda
def test_a_cuda_generator_draws_what_a_cpu_generator_seeded_alike_draws():
    """cpd.mx.cast with a CUDA generator (through its CPU twin, as cpd.cast) gives the bits of a
    CPU generator with the same seed."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    x = torch.randn(4, 96, generator=torch.Generator().manual_seed(1))
    want = mx.cast(x, mx.MXFP4, "stochastic", generator=torch.Generator().manual_seed(7))
    got = mx.cast(x.cuda(), mx.MXFP4, "stochastic", generator=torch.Generator("cuda").manual_seed(7))
    assert torch.equal(got.cpu().view(torch.int32), want.view(torch.int32))
