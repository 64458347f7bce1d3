"""The CUDA kernels, executed on the host by the shim, give the CPU extension's bits.

Invariants defended (no GPU needed; cuda/shim/cpd_shim.h, cpd/_shim.py):
* every kernel of cuda/kernels/ (cast in every mode, stochastic included with sr_bits; encode,
  decode for each code width; arith; matmul plain/Kahan/block/stochastic/directed, simple and
  tiled) equals the CPU extension bit for bit, through the same launch marshalling as
  cuLaunchKernel (cpd/_kernels.py), with odd launch geometries (1 thread, 1 block, blocks of 33
  and 96 threads, ragged tails, misaligned and aliased pointers);
* the 64-bit index helpers (cpd/launch.h) are right past 2^31 and 2^32;
* the shim honours __syncthreads/__shared__ and the warp shuffles (lock-step lanes, per-mask
  groups, every width and mode, as the CUDA programming guide defines them), reports what a GPU
  leaves undefined in them, and rejects launches the driver would reject, and
  parameter arrays that do not match the kernel's signature (which the driver cannot check);
* under cpd._shim.on_host() the public API and the layers above it run the CUDA code path.
Sizes are small: the shim runs GPU threads one after another on one core.
"""

import ctypes

import pytest
import torch

import cpd
from cpd import _cpu, _kernels, _shim
from cpd.ops import _fmt_args

pytestmark = pytest.mark.skipif(not _shim.available(), reason="no host C++ compiler for the shim")

G = _kernels.Geometry
GEOMETRIES = [G(1, 1), G(33, 3), G(96, 1), G(256, None), G(64, 2)]
FORMATS = [cpd.E5M2, cpd.E4M3, cpd.E4M3FN, cpd.E2M1, cpd.FP16, cpd.BF16, cpd.FloatFormat(3, 0),
           cpd.FloatFormat(4, 3, subnormals=False), cpd.FloatFormat(8, 10, bias=140),
           cpd.FloatFormat(6, 12, subnormals=False, bias=40), cpd.FloatFormat(8, 22, specials="finite", bias=128)]
MODES = ["nearest", "stochastic", "toward_zero", "up", "down"]
SEED = (0x123456789ABCDEF, -(2**62) + 7)


def inputs(n=3001, seed=0):
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, generator=g)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 65000.0, 2**-17 * (1 + 2**-23),
                            1e-45, -3e38, 448.0, 464.0, 240.0, 248.0, 6.0, 0.25, -2**-130])
    return torch.cat([bits.view(torch.float32), torch.randn(n, generator=g) * 100, special])


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def ref_cast(x, fmt, mode, saturate=False, sr_bits=32):
    """The CPU extension through the op, with the fixed (seed, offset)."""
    seed = torch.tensor(SEED, dtype=torch.int64)
    return torch.ops.cpd.cast(x, seed, cpd.ops._fmt_spec(fmt), cpd.Rounding(mode).code, saturate, sr_bits)


# ------------------------------------------------------------------------------------ cast
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("mode", MODES)
def test_cast_matches_cpu(fmt, mode):
    x = inputs()
    for i, (saturate, sr_bits) in enumerate([(False, 32), (True, 7 if mode == "stochastic" else 32)]):
        want = ref_cast(x, fmt, mode, saturate, sr_bits)
        out = torch.full_like(x, 7.0)
        _kernels.cast(x, out, _fmt_args(fmt), cpd.Rounding(mode).code, saturate, sr_bits, *SEED, _shim.launch,
                      GEOMETRIES[(i + len(fmt.name)) % len(GEOMETRIES)])
        assert same_bits(out, want), (fmt.name, mode, saturate)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
@pytest.mark.parametrize("mode", ["nearest", "stochastic"])
def test_cast_ragged_misaligned_in_place(geometry, mode):
    """Tails of 1-3 elements, pointers off the 16-byte grid (scalar path), and out = x."""
    base = inputs(97)
    for n in (1, 2, 3, 4, 5, 8, 13, 203):
        for shift in (0, 1, 3):
            x = base[shift:shift + n]
            want = ref_cast(x.clone(), cpd.E4M3, mode)
            out = torch.empty(n + 1)[1:] if shift else torch.empty(n)  # misaligned output too
            _kernels.cast(x, out, _fmt_args(cpd.E4M3), cpd.Rounding(mode).code, False, 32, *SEED, _shim.launch,
                          geometry)
            assert same_bits(out, want), (n, shift)
            y = x.clone()
            _kernels.cast(y, y, _fmt_args(cpd.E4M3), cpd.Rounding(mode).code, False, 32, *SEED, _shim.launch,
                          geometry)
            assert same_bits(y, want), (n, shift, "in place")


# ------------------------------------------------------------------------------------ codes
@pytest.mark.parametrize("fmt", [cpd.E5M2, cpd.E4M3FN, cpd.E2M1, cpd.FP16, cpd.BF16, cpd.TF32,
                                 cpd.FloatFormat(8, 16, bias=127)], ids=lambda f: f.name)
def test_encode_decode_match_cpu(fmt):
    x = inputs(2000)
    if not fmt.has_nan:
        x = x[~torch.isnan(x)]
    for mode in ("nearest", "down"):
        want = cpd.encode(x, fmt, mode, saturate=True)
        codes = torch.empty_like(want)
        _kernels.encode(x, codes, _fmt_args(fmt), cpd.Rounding(mode).code, True, _shim.launch, G(33, 3))
        assert torch.equal(codes, want), (fmt.name, mode)
    codes = torch.arange(1 << fmt.bits) if fmt.bits <= 12 else want
    codes = codes.to(cpd.code_dtype(fmt)) if fmt.bits != 8 else codes.to(torch.uint8)
    want = cpd.decode(codes, fmt)
    out = torch.empty(codes.shape)
    _kernels.decode(codes, out, _fmt_args(fmt), _shim.launch, G(64, 2))
    assert same_bits(out, want), fmt.name


# ------------------------------------------------------------------------------------ arith
@pytest.mark.parametrize("op", [0, 1, 2])
@pytest.mark.parametrize("mode", MODES)
def test_arith_matches_cpu(op, mode):
    g = torch.Generator().manual_seed(op)
    a, b, c = (inputs(600, seed=s) for s in (1, 2, 3))
    a = torch.where(torch.rand(a.shape, generator=g) < 0.5, a, torch.randn(a.shape, generator=g))
    seed = torch.tensor(SEED, dtype=torch.int64)
    for fmt, sat in ((cpd.E5M2, False), (cpd.BF16, True), (cpd.FloatFormat(6, 12, subnormals=False, bias=40), False)):
        want = torch.ops.cpd.arith(op, a, b, c, seed, cpd.ops._fmt_spec(fmt), cpd.Rounding(mode).code, sat, 32)
        out = torch.empty_like(a)
        _kernels.arith(op, a, b, c, out, _fmt_args(fmt), cpd.Rounding(mode).code, sat, 32, *SEED, _shim.launch,
                       G(33, 5))
        assert same_bits(out, want), (op, mode, fmt.name)


# ------------------------------------------------------------------------------------ matmul
MATMUL_CASES = [dict(mul=cpd.E5M2, acc=cpd.FloatFormat(5, 10)), dict(mul=cpd.E4M3, acc=cpd.BF16, kahan=True),
                dict(acc=cpd.FloatFormat(5, 2), block=4), dict(acc=cpd.FP16, kahan=True, block=3),
                dict(mul=cpd.BF16, acc=cpd.FP32)]


def _matmul_both(a, b, kw, rounding, kernel, geometry=G()):
    """(CPU extension result, shim result) of the same matmul with the fixed seed. The reference is
    the extension's generic loop (dot_step on float32 bits, path 1): its lane paths give the same
    values, but a NaN made by inf - inf there carries the host's sign (x86: negative), where
    the core's generic steps, the GPU and the shim give the canonical positive NaN."""
    mul, acc = kw.get("mul"), kw["acc"]
    code = cpd.Rounding(rounding).code
    B, M, K = a.shape
    want = torch.empty(B, M, b.shape[2])
    _cpu.extension().matmul_out(a, b, want, mul is not None, *_fmt_args(mul or acc), *_fmt_args(acc),
                                kw.get("kahan", False), kw.get("block", 0), code, False, 32, *SEED, 1)
    out = torch.full((B, M, b.shape[2]), 3.0)
    _kernels.matmul(a, b, out, None if mul is None else _fmt_args(mul), _fmt_args(acc), kw.get("kahan", False),
                    kw.get("block", 0), code, False, 32, *SEED, _shim.launch, geometry, kernel=kernel)
    return want, out


@pytest.mark.parametrize("kernel", ["simple", "tiled"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic", "down"])
@pytest.mark.parametrize("kw", MATMUL_CASES, ids=lambda k: "-".join(f"{n}={getattr(v, 'name', v)}" for n, v in k.items()))
def test_matmul_matches_cpu(kernel, rounding, kw):
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 17, 33, generator=g), torch.randn(2, 33, 19, generator=g)
    a[0, 3, 5] = float("inf")
    want, got = _matmul_both(a, b, kw, rounding, kernel, G(33, 2))
    assert same_bits(got, want)


@pytest.mark.parametrize("kernel", ["simple", "tiled"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 1, 7, 1), (1, 65, 3, 1), (3, 5, 1, 70), (1, 64, 16, 64),
                                   (2, 67, 20, 66)])
def test_matmul_shapes(kernel, shape):
    """Single outputs, K = 1, ragged tiles in both directions, batches."""
    B, M, K, N = shape
    g = torch.Generator().manual_seed(sum(shape))
    a, b = torch.randn(B, M, K, generator=g), torch.randn(B, K, N, generator=g)
    for kw in MATMUL_CASES[:3]:
        want, got = _matmul_both(a, b, kw, "stochastic", kernel, G(64, 3))
        assert same_bits(got, want), (shape, kw)


# ------------------------------------------------------------------------------------ index helpers
def test_index_helpers_past_2_31():
    lib_file = __file__.rsplit("/", 1)[0] + "/kernels/shim_probe.cu"
    n = 4
    cases = [(2**22 - 1, 1024, 2**22, 2**32 + 5), (2**31 - 1, 256, 2**31 - 1, 2**40), (7, 96, 3, 2**31 + 9)]
    for block, bdim, gdim, big in cases:
        out = torch.zeros(n + 3, dtype=torch.int64)
        _shim.launch(_kernels.Launch(lib_file, "probe_index", (1, 1, 1), (1, 1, 1),
                                     ((ctypes.c_void_p, out.data_ptr()), (ctypes.c_int, n), (ctypes.c_uint, block),
                                      (ctypes.c_uint, bdim), (ctypes.c_uint, gdim), (ctypes.c_longlong, big))))
        first = [block * bdim + t for t in range(n)]
        stride = bdim * gdim
        count = len(range(block * bdim, big, stride))
        assert out.tolist() == first + [stride, -(-big // 4), count], (block, bdim, gdim, big)
        assert first[0] >= 2**31 or big > 2**31


def test_syncthreads_and_shared():
    lib_file = __file__.rsplit("/", 1)[0] + "/kernels/shim_probe.cu"
    for threads, blocks in ((32, 3), (96, 2), (256, 1)):
        n = threads * blocks
        x = torch.arange(n, dtype=torch.float32)
        y = torch.empty(n)
        _shim.launch(_kernels.Launch(lib_file, "probe_reverse", (blocks, 1, 1), (threads, 1, 1),
                                     ((ctypes.c_void_p, x.data_ptr()), (ctypes.c_void_p, y.data_ptr()),
                                      (ctypes.c_int, n))))
        assert torch.equal(y, x.reshape(blocks, threads).flip(1).reshape(-1))
    y = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="probe_divergent.*__syncthreads"):
        _shim.launch(_kernels.Launch(lib_file, "probe_divergent", (1, 1, 1), (32, 1, 1),
                                     ((ctypes.c_void_p, y.data_ptr()),)))


def _shuffle_source(op: str, lane: int, arg: int, width: int) -> int:
    """The lane a shuffle reads, as the CUDA programming guide defines it (independent of the
    shim's code): within the caller's segment of ``width`` lanes; up/down past the segment and xor
    into a later segment read the caller's own lane."""
    seg, pos = lane - lane % width, lane % width
    if op == "idx":
        return seg + arg % width
    if op == "up":
        return lane - arg if pos >= arg else lane
    if op == "down":
        return lane + arg if pos + arg < width else lane
    src = (lane ^ arg) % 32
    return lane if src >= seg + width else src


def test_warp_shuffles():
    """__shfl_*_sync at every width and mode, 4- and 8-byte values, over two warps."""
    lib_file = __file__.rsplit("/", 1)[0] + "/kernels/shim_probe.cu"
    threads, k = 64, 14
    out = torch.full((threads * k,), -1, dtype=torch.int64)
    _shim.launch(_kernels.Launch(lib_file, "probe_shuffles", (1, 1, 1), (threads, 1, 1),
                                 ((ctypes.c_void_p, out.data_ptr()),)))
    got = out.view(threads, k).tolist()
    cases = [("xor", 1, 32), ("xor", 16, 32), ("xor", 5, 8), ("xor", 8, 8), ("xor", 24, 16), None, ("idx", 3, 8),
             ("idx", 19, 16), ("up", 3, 16), ("down", 3, 16), ("down", 1, 32), ("xor", 2, 32), ("xor", 4, 32),
             ("xor", 31, 32)]
    for t in range(threads):
        warp, lane = divmod(t, 32)
        for c, case in enumerate(cases):
            src = (lane * 7) % 32 if case is None else _shuffle_source(case[0], lane, case[1], case[2])
            want = 1000 * (32 * warp + src) + 7
            want = want * 4000000000 if c == 11 else want
            assert got[t][c] == want, (t, c, case)


def test_warp_groups_with_their_own_masks():
    """Groups of 8 lanes synchronize with their own masks and trip counts (a partial last warp)."""
    lib_file = __file__.rsplit("/", 1)[0] + "/kernels/shim_probe.cu"
    threads = 40
    out = torch.zeros(threads, dtype=torch.int32)
    _shim.launch(_kernels.Launch(lib_file, "probe_groups", (1, 1, 1), (threads, 1, 1),
                                 ((ctypes.c_void_p, out.data_ptr()),)))
    want = []
    for t in range(threads):
        group = range(t - t % 8, t - t % 8 + 8)
        want.append(max((u * 37) % 101 for u in group) + 1000 * ((t // 8) % 3 + 1))
    assert out.tolist() == want


@pytest.mark.parametrize("kind,match", [(0, "leaves its lane out"), (1, "has exited or does not exist"),
                                        (2, "waits at __shfl_xor_sync with mask 0xffffffff for ever"),
                                        (3, "meet with mask 0xffffffff at"), (4, "width 12"),
                                        (5, "a lane outside the mask")])
def test_warp_misuse_is_reported(kind, match):
    """What a GPU leaves undefined in a warp operation is an error of the launch on the shim."""
    lib_file = __file__.rsplit("/", 1)[0] + "/kernels/shim_probe.cu"
    out = torch.zeros(32, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=f"probe_warp_misuse.*{match}"):
        _shim.launch(_kernels.Launch(lib_file, "probe_warp_misuse", (1, 1, 1), (32, 1, 1),
                                     ((ctypes.c_int, kind), (ctypes.c_void_p, out.data_ptr()))))


def test_bad_launches_are_reported():
    x = torch.randn(10)
    good = dict(kernel_file="cast.cu", name="cpd_cast_nearest", grid=(1, 1, 1), block=(32, 1, 1))
    args = [(ctypes.c_void_p, x.data_ptr()), (ctypes.c_void_p, x.data_ptr()), (ctypes.c_longlong, 10),
            *[(ctypes.c_int, v) for v in (5, 2, 15, 0, 1, 0, 32)], (ctypes.c_ulonglong, 0), (ctypes.c_ulonglong, 0)]
    _shim.launch(_kernels.Launch(**good, args=tuple(args)))
    wrong_size = list(args)
    wrong_size[2] = (ctypes.c_int, 10)  # n passed as a 32-bit int
    with pytest.raises(RuntimeError, match="cpd_cast_nearest.*parameter 2 has 4 bytes.*8"):
        _shim.launch(_kernels.Launch(**good, args=tuple(wrong_size)))
    with pytest.raises(RuntimeError, match="cpd_cast_nearest.*11 parameters given.*12"):
        _shim.launch(_kernels.Launch(**good, args=tuple(args[:-1])))
    with pytest.raises(RuntimeError, match="invalid block"):
        _shim.launch(_kernels.Launch(**{**good, "block": (1025, 1, 1)}, args=tuple(args)))
    with pytest.raises(RuntimeError, match="no kernel named cpd_nope"):
        _shim.launch(_kernels.Launch(**{**good, "name": "cpd_nope"}, args=tuple(args)))
    with pytest.raises(ValueError, match="threads"):
        G(257)


# ------------------------------------------------------------------------------------ the public API
def test_public_api_on_host():
    """cpd.cast / encode / decode / add / fma / matmul / sum through the CUDA implementations."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(5, 7, generator=g) * 30
    a, b = torch.randn(3, 9, generator=g), torch.randn(9, 4, generator=g)

    def run():
        gen = lambda: torch.Generator().manual_seed(4)  # noqa: E731
        return [cpd.cast(x.t(), cpd.E4M3, "stochastic", generator=gen()), cpd.cast(x, cpd.E5M2),
                cpd.encode(x, cpd.E4M3FN, saturate=True).to(torch.float32), cpd.decode(torch.arange(256), cpd.E5M2),
                cpd.add(x, x[0], cpd.BF16, "up"), cpd.fma(x, x, x, cpd.E5M2, "stochastic", generator=gen()),
                cpd.matmul(a, b, mul=cpd.E5M2, acc=cpd.FP16, kahan=True),
                cpd.sum(x, 1, acc=cpd.BF16, rounding="stochastic", generator=gen())]

    want = run()
    with _shim.on_host(threads=33, max_blocks=2):
        got = run()
    for w, r in zip(want, got):
        assert same_bits(torch.nan_to_num(w, nan=1.5), torch.nan_to_num(r, nan=1.5))


def test_cast_every_small_format():
    """Every format of at most 8 bits, every mode: its values, the midpoints between neighbours,
    and the float32 neighbours of both (where rounding decides), against the CPU extension."""
    from formats_grid import small_formats

    for fmt in small_formats():
        v = cpd.decode(torch.arange(1 << fmt.bits), fmt)
        v = v[torch.isfinite(v)].unique()
        mids = (v[1:].double() + v[:-1].double()) / 2
        pts = torch.cat([v, mids.to(torch.float32), v * 2, torch.tensor([float("inf"), float("nan")])])
        pts = torch.cat([pts, torch.nextafter(pts, torch.tensor(float("inf"))),
                         torch.nextafter(pts, torch.tensor(-float("inf")))])
        pts = torch.cat([pts, -pts])
        for mode in MODES:
            for saturate in (False, True):
                want = ref_cast(pts, fmt, mode, saturate)
                out = torch.empty_like(pts)
                _kernels.cast(pts, out, _fmt_args(fmt), cpd.Rounding(mode).code, saturate, 32, *SEED, _shim.launch,
                              G(128, 2))
                assert same_bits(out, want), (fmt, mode, saturate)
