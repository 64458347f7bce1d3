"""The GEMM family kernels (cuda/kernels/matmul.cu: cpd_matmul_chain, _lanes, _kahan; their steps in
cuda/include/cpd/gemm.h), executed on the host by the shim, give the CPU extension's generic steps'
bits (path 1: dot_step on float32 bits, itself checked against exact oracles in test_matmul.py).

Invariants defended (no GPU needed):
* each family kernel equals the generic steps on ragged shapes (M, N, K not multiples of the tiles
  or of the K slice, K = 0 and 1, batches), on inputs spread over every float32 binade, subnormal
  products and sums, overflow, signed zeros, and inf/NaN operands (a chain output ending as NaN is
  redone by the generic steps, so even NaN bits agree);
* the binary16 families (LANES16, KAHAN16) round on the host with round_f, the function the
  GPU's binary16 pair instructions (cvt.rn.f16x2.f32, add.rn.f16x2, ...) compute; those
  instructions themselves are checked only on a GPU (cuda mark); the BF16 families (LANESBF,
  KAHANBF) run the same integer rounding on both;
* a spec outside a kernel's family still gets the generic bits there (the kernels' safety net);
* cpd/_kernels.py matmul_family routes exactly the specs of gemm.h's predicates to each kernel.
Shapes are small: the shim runs GPU threads one after another on one core.
"""

import pytest
import torch

import cpd
from cpd import _cpu, _kernels, _shim
from cpd.ops import _fmt_args

pytestmark = pytest.mark.skipif(not _shim.available(), reason="no host C++ compiler for the shim")

G = _kernels.Geometry
F510 = cpd.FloatFormat(5, 10)
FAMILY_CASES = {
    "chain": [dict(acc=cpd.FP32)],
    "f32": [dict(mul=cpd.E4M3, acc=cpd.FP32), dict(mul=cpd.E5M2, acc=cpd.FP32), dict(mul=cpd.FP16, acc=cpd.FP32),
            dict(mul=cpd.E4M3FN, acc=cpd.FP32), dict(mul=cpd.FloatFormat(6, 12), acc=cpd.FP32)],
    "kahan32": [dict(mul=cpd.E4M3, acc=cpd.FP32, kahan=True), dict(mul=cpd.FP16, acc=cpd.FP32, kahan=True)],
    "fkahan32": [dict(acc=cpd.FP32, kahan=True)],
    "lanes16": [dict(mul=cpd.E5M2, acc=F510), dict(mul=cpd.E4M3, acc=cpd.FP16), dict(mul=cpd.E4M3FN, acc=cpd.FP16)],
    "kahan16": [dict(mul=cpd.E5M2, acc=F510, kahan=True), dict(mul=cpd.E4M3, acc=cpd.FP16, kahan=True)],
    "lanes": [dict(mul=cpd.FloatFormat(4, 3, subnormals=False), acc=cpd.FloatFormat(6, 9)),
              dict(mul=cpd.FloatFormat(5, 2, subnormals=False), acc=F510)],
    "kahan": [dict(mul=cpd.E4M3, acc=cpd.FloatFormat(6, 9), kahan=True)],
    # (the "bf" families: accumulators of float32's exponent range and <= 11 bits: BF16, TF32, (8, 3))
    "lanesbf": [dict(mul=cpd.E5M2, acc=cpd.BF16), dict(mul=cpd.E4M3FN, acc=cpd.BF16),
                dict(mul=cpd.FloatFormat(7, 2), acc=cpd.BF16), dict(mul=cpd.FP16, acc=cpd.TF32),
                dict(mul=cpd.E4M3, acc=cpd.FloatFormat(8, 3))],
    "kahanbf": [dict(mul=cpd.E4M3, acc=cpd.BF16, kahan=True), dict(mul=cpd.E5M2, acc=cpd.BF16, kahan=True),
                dict(mul=cpd.E5M2, acc=cpd.TF32, kahan=True)],
    "fusedbf": [dict(acc=cpd.BF16), dict(acc=cpd.TF32), dict(acc=cpd.FloatFormat(8, 3))],
    "fkahanbf": [dict(acc=cpd.BF16, kahan=True), dict(acc=cpd.TF32, kahan=True)],
    "fused16": [dict(acc=cpd.FP16)],
    "fkahan16": [dict(acc=cpd.FP16, kahan=True)],
    "f32b": [dict(mul=cpd.E4M3, acc=cpd.FP32, block=4), dict(mul=cpd.E5M2, acc=cpd.FP32, kahan=True, block=3),
             dict(mul=cpd.FP16, acc=cpd.FP32, block=32)],
    "ff32b": [dict(acc=cpd.FP32, block=5), dict(acc=cpd.FP32, kahan=True, block=2)],
}
SEED = (0x123456789ABCDEF, 7)
#: (mul, acc) pairs of the SR family (stochastic rounding: cpd/gemm.h gemm_sr_applies)
SR_FORMATS = [(None, cpd.FP16), (None, cpd.BF16), (cpd.E4M3, cpd.BF16), (cpd.E5M2, F510), (cpd.E4M3FN, cpd.FP16),
              (cpd.FloatFormat(4, 3, subnormals=False), cpd.FloatFormat(6, 9))]


def exact(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


def same_bits(a, b):
    """Equal bits, except that a NaN matches any NaN: the CPU extension's NaN from inf - inf carries
    the host's sign (x86: negative), also against the simple kernel; NaN bits are checked exactly
    against the generic steps on the same device (``run``)."""
    nan = torch.isnan(a)
    return exact(torch.where(nan, 0.0, a), torch.where(torch.isnan(b), 0.0, b)) and torch.equal(nan, torch.isnan(b))


def launch(a, b, kw, kernel, geometry=G()):
    mul, acc = kw.get("mul"), kw["acc"]
    out = torch.full((a.shape[0], a.shape[1], b.shape[2]), 3.0)
    _kernels.matmul(a, b, out, None if mul is None else _fmt_args(mul), _fmt_args(acc), kw.get("kahan", False),
                    kw.get("block", 0), 0, False, 32, *SEED, _shim.launch, geometry, kernel=kernel)
    return out


def run(a, b, kw, kernel, geometry=G()):
    """(CPU generic steps, shim kernel) of the same round-to-nearest matmul; the kernel's bits are
    also those of the generic steps on the same device (cpd_matmul_simple), NaN bits included."""
    mul, acc = kw.get("mul"), kw["acc"]
    B, M, _ = a.shape
    want = torch.empty(B, M, b.shape[2])
    _cpu.extension().matmul_out(a, b, want, mul is not None, *_fmt_args(mul or acc), *_fmt_args(acc),
                                kw.get("kahan", False), kw.get("block", 0), 0, False, 32, *SEED, 1)
    got = launch(a, b, kw, kernel, geometry)
    assert exact(got, launch(a, b, kw, "simple")), (kernel, kw)
    return want, got


def spread(shape, seed, lo=-30, hi=30):
    """Random signs and mantissas over the binades 2^lo .. 2^hi."""
    g = torch.Generator().manual_seed(seed)
    m = torch.rand(shape, generator=g) + 1.0
    e = torch.randint(lo, hi + 1, shape, generator=g).float()
    s = torch.randint(0, 2, shape, generator=g).float() * 2 - 1
    return s * m * torch.exp2(e)


def cases():
    return [(fam, kw) for fam, kws in FAMILY_CASES.items() for kw in kws]


def ids(case):
    fam, kw = case
    return fam + "-" + "-".join(f"{n}={getattr(v, 'name', v)}" for n, v in kw.items())


# ------------------------------------------------------------------------------------ routing
def test_matmul_family_routes_by_the_headers_predicates():
    f = lambda x: None if x is None else _fmt_args(x)  # noqa: E731
    fam = lambda mul, acc, kahan=False, block=0, mode=0, sat=False: _kernels.matmul_family(  # noqa: E731
        f(mul), f(acc), kahan, block, mode, sat)
    for family, kws in FAMILY_CASES.items():
        for kw in kws:
            assert fam(kw.get("mul"), kw["acc"], kw.get("kahan", False), kw.get("block", 0)) == family, kw
    # float32 chain: only float32 itself, nearest, no saturation, no Kahan, no blocks
    assert fam(None, cpd.FP32, sat=True) == "tiled"
    # float32 accumulator, what the chain leaves: rounded products (plain, Kahan), exact products with Kahan
    assert fam(None, cpd.FP32, kahan=True) == "fkahan32"
    assert fam(cpd.E4M3FN, cpd.FP32) == "f32" and fam(cpd.E2M1, cpd.FP32, kahan=True) == "kahan32"
    assert fam(cpd.E4M3, cpd.FP32, sat=True) == "tiled" and fam(cpd.E4M3, cpd.FP32, block=4) == "f32b"
    assert fam(cpd.E4M3, cpd.FP32, mode=2) == "tiled" and fam(None, cpd.FP32, kahan=True, block=2) == "ff32b"
    assert fam(cpd.E4M3, cpd.FP32, sat=True, block=4) == "tiled" and fam(cpd.BF16, cpd.FP32, block=4) == "tiled"
    assert fam(cpd.E4M3, cpd.FP32, block=4, mode=2) == "tiled" and fam(None, cpd.FP16, block=4) == "tiled"
    assert fam(cpd.E4M3FNUZ, cpd.FP32) == "tiled"      # not a plain convention
    assert fam(cpd.FloatFormat(8, 22), cpd.FP32) == "tiled"  # 23 bits: mul_f's fused rounding needs <= 21
    assert fam(cpd.BF16, cpd.FP32) == "tiled"          # emax 127: the product's constant 2^(E + 23 - man) overflows
    assert fam(cpd.FloatFormat(4, 3, subnormals=False), cpd.FP32) == "tiled"  # the product's clamp needs subnormals
    assert fam(cpd.E4M3, cpd.FloatFormat(8, 23, subnormals=False)) == "tiled"
    assert fam(None, cpd.FP32, block=4) == "ff32b"   # blocks: the blocked float32 family
    assert fam(None, cpd.FP32, mode=1) == "tiled"
    assert fam(None, cpd.FloatFormat(8, 23, subnormals=False)) == "tiled"
    # binary16 with exact products: the fused families (not F510 with another bias, not saturating)
    assert fam(None, cpd.FP16) == "fused16" and fam(None, cpd.FP16, kahan=True) == "fkahan16"
    assert fam(None, cpd.FP16, sat=True) == "tiled" and fam(None, cpd.FP16, block=2) == "tiled"
    assert fam(None, cpd.FloatFormat(5, 10, bias=14)) == "tiled" and fam(None, cpd.FP16, mode=3) == "tiled"
    # lanes: accumulators of <= 11 bits whose quanta are float32 normals; mul values within acc
    assert fam(cpd.E5M2, cpd.BF16) == "lanesbf"        # BF16's quantum 2^-133: not add_fast_applies, its own family
    # BF16 lanes: an 8-bit-like mul with subnormals and nearest_f_applies; mul=None: the fused families
    assert fam(None, cpd.BF16) == "fusedbf" and fam(None, cpd.BF16, kahan=True) == "fkahanbf"
    assert fam(None, cpd.BF16, sat=True) == "tiled" and fam(None, cpd.BF16, mode=1) == "sr"
    assert fam(None, cpd.BF16, block=4) == "tiled" and fam(None, cpd.FloatFormat(8, 7, subnormals=False)) == "tiled"
    assert fam(None, cpd.FloatFormat(8, 11)) == "tiled"  # 12 bits: Figueroa's 24 >= 2p + 2 fails
    assert fam(None, cpd.FloatFormat(8, 0)) == "tiled" and fam(None, cpd.FloatFormat(8, 7, bias=130)) == "tiled"
    assert fam(cpd.FloatFormat(4, 3, subnormals=False), cpd.BF16) == "tiled"
    assert fam(cpd.FP16, cpd.BF16) == "tiled"          # FP16 values are not BF16 values
    assert fam(cpd.E5M2, cpd.BF16, sat=True) == "tiled"
    assert fam(cpd.E5M2, cpd.BF16, mode=1) == "sr" and fam(cpd.E5M2, cpd.BF16, block=4) == "tiled"
    assert fam(cpd.BF16, cpd.FP16) == "tiled"          # BF16 values are not FP16 values
    assert fam(cpd.E5M2, cpd.E4M3) == "tiled"          # E5M2's range exceeds E4M3's
    assert fam(cpd.E4M3, cpd.FloatFormat(8, 12)) == "tiled"  # 13 bits: Figueroa's bound fails
    assert fam(cpd.E4M3FNUZ, cpd.FP16) == "tiled"      # not a plain convention
    assert fam(cpd.E5M2, F510, mode=2) == "tiled"
    assert fam(cpd.E5M2, F510, block=2) == "tiled"
    # SR: stochastic rounding, formats within sr_lane_applies (<= 11 bits, fast cast, plain convention),
    # with or without Kahan, blocks and saturation; the directed modes stay generic
    for mul, acc in SR_FORMATS:
        for kahan, block, sat in ((False, 0, False), (True, 0, False), (False, 4, True), (True, 3, False)):
            assert fam(mul, acc, kahan, block, 1, sat) == "sr", (mul, acc, kahan, block)
    assert fam(None, cpd.FP32, mode=1) == "tiled" and fam(None, cpd.TF32, mode=1) == "sr"
    assert fam(cpd.E4M3FNUZ, cpd.FP16, mode=1) == "tiled" and fam(cpd.E4M3, cpd.FloatFormat(8, 12), mode=1) == "tiled"
    assert fam(None, cpd.FloatFormat(5, 10, bias=140), mode=1) == "tiled"  # emin -139 < -126: not the fast cast
    assert fam(cpd.E5M2, F510, mode=3) == "tiled"


def test_kernel_name_is_checked():
    a = torch.zeros(1, 1, 1)
    with pytest.raises(ValueError, match="kernel must be"):
        _kernels.matmul(a, a, a.clone(), None, _fmt_args(cpd.FP32), False, 0, 0, False, 32, 0, 0, _shim.launch,
                        kernel="fast")


# ------------------------------------------------------------------------------------ bits
@pytest.mark.parametrize("case", cases(), ids=ids)
@pytest.mark.parametrize("shape", [(1, 1, 0, 1), (1, 1, 1, 1), (2, 5, 9, 7), (1, 17, 8, 3), (1, 66, 19, 70),
                                   (1, 130, 17, 129)])
def test_family_shapes(case, shape):
    """Ragged tiles in M and N, K = 0, 1, a multiple of the slice and a partial last slice, batches."""
    fam, kw = case
    B, M, K, N = shape
    if fam != "chain" and M * N > 2000:
        shape = (B, 65, K, 66)
        M, N = 65, 66
    a, b = torch.randn(B, M, K, generator=torch.Generator().manual_seed(M)), spread((B, K, N), K, -8, 8)
    want, got = run(a, b, kw, fam, G(256, 3))
    assert same_bits(got, want), (shape, kw)


@pytest.mark.parametrize("case", cases(), ids=ids)
def test_family_every_binade_and_specials(case):
    """Inputs over every float32 binade (the products over float32's range and beyond it: overflow
    to inf, subnormal products and sums), signed zeros, cancellation, inf and NaN operands."""
    fam, kw = case
    B, M, K, N = 2, 9, 37, 10
    a = spread((B, M, K), 1, -75, 64)
    b = spread((B, K, N), 2, -75, 64)
    a[0, 0] = torch.exp2(torch.arange(-149.0, -149.0 + K))         # subnormal products
    a[0, 1] = 0.0
    a[0, 2] = -0.0                                                 # signed zero sums
    b[0, :, 3] = -b[0, :, 4]                                       # exact cancellation
    a[0, 3, 5], a[0, 4, 6], a[0, 5, 7] = float("inf"), -float("inf"), float("nan")
    a[0, 6, 1], b[0, 1, 2] = float("inf"), 0.0                      # 0 * inf
    a[1, 7] = 3e38                                                 # overflow mid-sum
    b[1, :, 5] = torch.tensor([(-1.0) ** k for k in range(K)])
    a[1, 8] = torch.exp2(torch.arange(-120.0, -120.0 + K))
    b[1, :, 6] = 2.0 ** -25                                         # sums in float32's subnormal range
    want, got = run(a, b, kw, fam, G(256, 2))
    assert same_bits(got, want), kw
    want, got = run(a.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous(), kw, fam, G(256, 1))
    assert same_bits(got, want), kw


@pytest.mark.parametrize("case", cases(), ids=ids)
def test_family_values_of_the_formats(case):
    """Operands that are values of the mul format (products near the accumulator's ties) and long
    sums that overflow and underflow the accumulator."""
    fam, kw = case
    fmt = kw.get("mul") or cpd.BF16
    B, M, K, N = 1, 7, 200, 9
    a = cpd.cast(spread((B, M, K), 5, -20, 12), fmt)
    b = cpd.cast(spread((B, K, N), 6, -20, 12), fmt)
    want, got = run(a, b, kw, fam)
    assert same_bits(got, want), kw


@pytest.mark.parametrize("kernel", sorted(_kernels.FAMILY_KERNELS))
def test_spec_outside_the_family_gets_the_generic_bits(kernel):
    """A family kernel launched for another spec (the Python route and the header disagree) runs the
    generic steps for every output: right bits, only slower."""
    g = torch.Generator().manual_seed(11)
    a, b = torch.randn(2, 9, 12, generator=g), torch.randn(2, 12, 5, generator=g)
    for kw in (dict(acc=cpd.BF16, kahan=True), dict(mul=cpd.E5M2, acc=cpd.BF16), dict(acc=cpd.FP32),
               dict(mul=cpd.E4M3, acc=cpd.FP32, block=3)):
        if _kernels.matmul_family(None if kw.get("mul") is None else _fmt_args(kw["mul"]), _fmt_args(kw["acc"]),
                                  kw.get("kahan", False), kw.get("block", 0), 0, False) == kernel:
            continue
        want, got = run(a, b, kw, kernel)
        assert same_bits(got, want), kw


def test_auto_routes_and_matches():
    """kernel='auto' (the default) picks the family kernel; the bits are the generic ones."""
    seen = []
    def spy(launch, device):
        seen.append(launch.name)
        _shim.launch(launch, device)
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(1, 6, 10, generator=g), torch.randn(1, 10, 4, generator=g)
    for fam, kws in FAMILY_CASES.items():
        kw = kws[0]
        want = launch(a, b, kw, "simple")
        got = torch.empty_like(want)
        _kernels.matmul(a, b, got, None if kw.get("mul") is None else _fmt_args(kw["mul"]), _fmt_args(kw["acc"]),
                        kw.get("kahan", False), kw.get("block", 0), 0, False, 32, *SEED, spy)
        assert exact(got, want) and seen[-1] == _kernels.FAMILY_KERNELS[fam][0], (fam, seen)


def _grid_targets(fmt, n, g, top=None):
    """n products on the rounding points of fmt: its values and the midpoints between neighbours
    (ties to even), in the normal and subnormal ranges, and half the smallest subnormal, with
    random signs (float64, exact); binades up to top (default: emax)."""
    p, emin, emax = fmt.man, fmt.emin, fmt.emax
    e = torch.randint(emin - 1, (emax if top is None else top) + 1, (n,), generator=g)  # emin - 1: subnormals
    i = torch.randint(0, 2 ** (p + 1), (n,), generator=g).double()     # half-quanta: values and midpoints
    q = torch.exp2(torch.maximum(e, torch.tensor(emin)).double() - p)
    t = torch.where(e < emin, i / 2 * q, (2 ** p + i / 2) * q)         # |t| below 2^emin: subnormal grid
    pick = torch.randint(0, 16, (n,), generator=g)
    t = torch.where(pick == 0, torch.tensor(2.0 ** (emin - p - 1)), t)  # half the smallest subnormal
    return t * (torch.randint(0, 2, (n,), generator=g).double() * 2 - 1)


@pytest.mark.parametrize("case", [c for c in cases() if c[0] in ("lanes16", "kahan16", "lanesbf", "kahanbf", "f32",
                                                                  "kahan32", "f32b")], ids=ids)
def test_binary16_families_at_the_rounding_points(case):
    """(The binary16, BF16 and float32 families with a mul format: one product rounding.) Products
    exactly on the mul format's ties (normal and subnormal), at its overflow threshold and half its
    smallest subnormal, and just beside them (the exact product a*b off a tie by less
    than float32's own rounding of a*b: only the exact product decides, one FFMA); sums that round,
    overflow binary16 and cancel; zeros of both signs; a B operand so large that b * 2^(23 - man)
    overflows (LANES16's exponent product: a zero a gives 0, a tiny a a redo); inf and NaN."""
    fam, kw = case
    fmt = kw["mul"]
    B, M, K, N = 1, 12, 300, 10
    g = torch.Generator().manual_seed(27)
    t = _grid_targets(fmt, M * K, g, top=4).reshape(M, K)               # sums mostly finite ...
    t[:, :3] = _grid_targets(fmt, M * 3, g).reshape(M, 3)               # ... and the top binades
    t[10:, 0] = float(fmt.max) + 2.0 ** (fmt.emax - fmt.man - 1)         # the overflow threshold (a tie)
    t[11, 1] = -t[11, 0]
    shift = torch.randint(-20, 21, (K,), generator=g).double()          # a = t * 2^s, b = 2^-s (1 + d)
    eps = torch.tensor([0.0, 0.0, 0.0, 2.0 ** -12, -2.0 ** -12, 2.0 ** -23, -2.0 ** -24, 2.0 ** -13])
    da = eps[torch.randint(0, len(eps), (M, K), generator=g)]
    db = eps[torch.randint(0, len(eps), (K, N), generator=g)]
    db[:, 0] = -da[0]                                                    # (1 + d)(1 - d): just below a tie
    a = (t * torch.exp2(shift) * (1 + da)).float()
    b = (torch.exp2(-shift)[:, None] * (1 + db)).float()
    b[:, 1] *= -1.0
    b[:, 2] = torch.exp2(-shift)
    a[9] = (float(fmt.max) * torch.exp2(shift)).float()                  # K * max: the binary16 sum overflows
    b[::3, 3] = 0.0
    b[1::3, 3] = -0.0
    a[2] = 0.0
    a[3] = -0.0
    b[5, 4] = 3e38                                                       # b * 2^(23 - man) = inf
    a[4, 5] = 2.0 ** -120                                                # ... times a tiny a: a finite product
    b[5, 5] = 2.0 ** 120
    a[5, 7], a[6, 8], a[7, 9] = float("inf"), float("nan"), -float("inf")
    a[8], b[:, 6] = (t[8] * torch.exp2(shift)).float(), -torch.exp2(-shift)  # the targets themselves: ties
    b[:, 7] = -b[:, 7]
    a, b = a[None], b[None]
    want, got = run(a, b, kw, fam, G(256, 1))
    assert same_bits(got, want), kw
    assert torch.isfinite(got).sum() > M * N // 3                        # many outputs are finite sums
    assert torch.isnan(got[0, 6]).all()                                  # a NaN a
    if kw["acc"].exp == 5:
        assert not torch.isfinite(got[0, 9, 2])                          # binary16 overflow


@pytest.mark.parametrize("acc", [cpd.BF16, cpd.TF32, cpd.FP16], ids=["bf16", "tf32", "fp16"])
@pytest.mark.parametrize("kahan", [False, True], ids=["fused", "fkahan"])
def test_fused_families_round_once(kahan, acc):
    """FUSEDBF / FKAHANBF (BF16, TF32: the rounding's cut 16 or 13 bits) and FUSED16 / FKAHAN16
    (binary16) round a*b + x once (rounding to odd through float32): exact products a hair off the
    accumulator's ties, T (1 + d)(1 - d) = T - T d^2 with d = 2^-(22 - man) (BF16: 2^-15), which
    float32 rounds onto the tie T itself (a double rounding would then go to the even neighbour,
    half the time the wrong one), exactly on the ties (to even), in the subnormal range and at the
    overflow threshold; K = 1 (one rounding per output) and K = 3 (the tie reached by a running
    sum)."""
    g = torch.Generator().manual_seed(31)
    M, N, p, emin, emax = 40, 6, acc.man, acc.emin, acc.emax
    i = torch.randint(0, 2 ** p, (M,), generator=g).double()
    e = torch.randint(emin - p, emax - 7, (M,), generator=g).double()
    t = torch.where(e < emin, (i + 0.5) * 2.0 ** (emin - p), (2 ** p + i + 0.5) * torch.exp2(e - p))  # ties
    t[0] = (2 ** (p + 1) - 0.5) * 2.0 ** (emax - p)                  # the overflow threshold (a tie)
    t = t * (torch.randint(0, 2, (M,), generator=g).double() * 2 - 1)
    d = 2.0 ** -(22 - p)
    a = (t * (1 + d)).float()[:, None]                                # exact in float32 (p + 2 + 22 - p bits)
    b = torch.tensor([[1 - d, 1 + d, 1.0, -(1 - d), 1 - 2 * d, 1 + 2 * d]]).float()  # below, above, on ...
    assert N == b.shape[1] and torch.equal(a.double()[:, 0], t * (1 + d))
    kw = dict(acc=acc, kahan=kahan)
    fam = ("fkahan" if kahan else "fused") + ("16" if acc.exp == 5 else "bf")
    want, got = run(a[None], b[None], kw, fam)
    assert exact(got, want)
    assert not torch.isfinite(got[0, 0, :3]).all()                    # the threshold's products overflow
    # K = 3: a running sum s = u + v (a value of acc) then s + a*b near a tie of acc
    u = torch.zeros(M, 3)
    u[:, 1] = (t * 0.25).float()                                      # a value of acc (t / 4 has p + 2 bits: no)
    u[:, 1] = cpd.cast(u[:, 1], acc)
    u[:, 2] = a[:, 0]
    v = torch.zeros(3, N)
    v[1] = 1.0
    v[2] = b[0]
    want, got = run(u[None], v[None], kw, fam)
    assert exact(got, want)


# ------------------------------------------------------------------------------ stochastic (SR)
def run_sr(a, b, mul, acc, kahan=False, block=0, saturate=False, sr_bits=32, kernel="sr", geometry=G(256, 3)):
    """(CPU generic steps, shim kernel) of one stochastic matmul: the same (seed, offset), so the
    same words; the kernel's bits are also the simple kernel's (the generic steps on the device),
    NaN aside: the simple kernel's NaN from inf - inf in Kahan's steps can carry another sign than
    the CPU loops' (the family kernel's redo gives the CPU's here; same_bits's note)."""
    B, M, _ = a.shape
    m = None if mul is None else _fmt_args(mul)
    want = torch.empty(B, M, b.shape[2])
    _cpu.extension().matmul_out(a, b, want, mul is not None, *_fmt_args(mul or acc), *_fmt_args(acc), kahan, block,
                                1, saturate, sr_bits, *SEED, 1)

    def go(kern, geo):
        out = torch.full_like(want, 3.0)
        _kernels.matmul(a, b, out, m, _fmt_args(acc), kahan, block, 1, saturate, sr_bits, *SEED, _shim.launch, geo,
                        kernel=kern)
        return out

    got = go(kernel, geometry)
    assert same_bits(got, go("simple", G())), (mul, acc, kahan, block)
    return want, got


SR_MODES = [dict(), dict(kahan=True), dict(block=4), dict(kahan=True, block=3), dict(sr_bits=8, saturate=True),
            dict(sr_bits=1), dict(sr_bits=23, kahan=True)]


@pytest.mark.parametrize("mode", SR_MODES, ids=lambda m: "-".join(f"{k}={v}" for k, v in m.items()) or "plain")
@pytest.mark.parametrize("fmts", SR_FORMATS, ids=lambda f: f"{getattr(f[0], 'name', f[0])}-{f[1].name}")
def test_sr_family_matches_the_generic_steps(fmts, mode):
    """Every rounding stochastic: on ragged shapes (K = 1, a partial slice, tiles cut in M and N,
    batches) over binades -40..40 (subnormal and overflowing products and sums in the narrow
    formats), and on operands that are values of mul (sums landing on and near the grid, where
    sr_lane's window flags lanes for the exact redo)."""
    mul, acc = fmts
    g = torch.Generator().manual_seed(3)
    for (B, M, K, N), lo, hi in (((1, 1, 1, 1), -8, 8), ((2, 5, 9, 7), -40, 40), ((1, 66, 19, 70), -12, 12)):
        a, b = spread((B, M, K), K + lo, lo, hi), spread((B, K, N), K - lo, lo, hi)
        want, got = run_sr(a, b, mul, acc, **mode)
        assert same_bits(got, want), ((B, M, K, N), mode)
    fmt = mul or acc
    a = cpd.cast(torch.randn(1, 9, 150, generator=g) * 4, fmt)
    b = cpd.cast(torch.randn(1, 150, 11, generator=g), fmt)
    want, got = run_sr(a, b, mul, acc, **mode)
    assert same_bits(got, want), mode


@pytest.mark.parametrize("fmts", SR_FORMATS[:4], ids=lambda f: f"{getattr(f[0], 'name', f[0])}-{f[1].name}")
def test_sr_family_specials(fmts):
    """Signed zeros, exact cancellation, inf and NaN operands, overflow mid-sum, float32-subnormal
    products: the lanes at or above max, inf and NaN are redone by the exact functions."""
    mul, acc = fmts
    B, M, K, N = 2, 9, 21, 10
    a, b = spread((B, M, K), 1, -75, 64), spread((B, K, N), 2, -75, 64)
    a[0, 0] = torch.exp2(torch.arange(-149.0, -149.0 + K))
    a[0, 1], a[0, 2] = 0.0, -0.0
    b[0, :, 3] = -b[0, :, 4]
    a[0, 3, 5], a[0, 4, 6], a[0, 5, 7] = float("inf"), -float("inf"), float("nan")
    a[0, 6, 1], b[0, 1, 2] = float("inf"), 0.0
    a[1, 7] = 3e38
    for mode in (dict(), dict(kahan=True), dict(block=5, saturate=True)):
        want, got = run_sr(a, b, mul, acc, **mode)
        assert same_bits(got, want), mode
