"""Pure-torch implementation of the numerics core, used when no compiler is available.

It follows ``cuda/include/cpd/numerics.h`` step for step (same names: M, eq, E, ee, qexp, d, r)
on int64 tensors, so it is bit-identical to the compiled kernels and serves as their readable
twin; it is several times slower. The tests run it against the compiled path.
"""

from __future__ import annotations

import torch

from .formats import FloatFormat, Specials
from .rounding import Rounding

_M32 = 0xFFFFFFFF
_SIGN = 0x80000000
_INF = 0x7F800000
_QNAN = 0x7FC00000

#: Philox4x32 round count; must match PHILOX_ROUNDS in numerics.h.
PHILOX_ROUNDS = 10


def _u32(x: torch.Tensor) -> torch.Tensor:
    """float32 tensor -> its bits as non-negative int64."""
    return x.contiguous().view(torch.int32).to(torch.int64) & _M32


def _bits_to_float(bits: torch.Tensor) -> torch.Tensor:
    b = bits & _M32
    b = torch.where(b >= 1 << 31, b - (1 << 32), b)
    return b.to(torch.int32).view(torch.float32)


def _compose(r: torch.Tensor, qexp: torch.Tensor) -> torch.Tensor:
    """r * 2**qexp as float32 bits (int64); values >= 2**128 become +inf bits."""
    v = torch.ldexp(r.to(torch.float64), qexp.to(torch.float64)).to(torch.float32)
    return _u32(v)


def _max_bits(fmt: FloatFormat) -> int:
    import struct

    return struct.unpack("<I", struct.pack("<f", fmt.max))[0]


def _min_normal_bits(fmt: FloatFormat) -> int:
    import struct

    return struct.unpack("<I", struct.pack("<f", fmt.smallest_normal))[0]


def _split(a: torch.Tensor, fmt: FloatFormat):
    field, mant = a >> 23, a & 0x7FFFFF
    normal = field != 0
    M = mant | (normal.to(torch.int64) << 23)
    eq = field.clamp(min=1) - 150
    e_sub = torch.frexp(mant.to(torch.float64))[1].to(torch.int64) - 1 - 149
    E = torch.where(normal, field - 127, e_sub)
    ee = E.clamp(min=fmt.emin)
    qexp = ee - fmt.man
    return M, eq, ee, qexp, qexp - eq


def philox4x32(c: list[torch.Tensor], k0: int, k1: int, rounds: int = PHILOX_ROUNDS) -> list[torch.Tensor]:
    """Philox4x32 (Salmon et al. 2011) on int64 tensors holding 32-bit words."""
    c0, c1, c2, c3 = c
    for i in range(rounds):
        if i:
            k0 = (k0 + 0x9E3779B9) & _M32
            k1 = (k1 + 0xBB67AE85) & _M32
        p0 = 0xD2511F53 * c0  # wraps in int64; the masks below recover the 64-bit product's halves
        p1 = 0xCD9E8D57 * c2
        hi0, lo0 = (p0 >> 32) & _M32, p0 & _M32
        hi1, lo1 = (p1 >> 32) & _M32, p1 & _M32
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return [c0, c1, c2, c3]


def random_words(start: int, n: int, seed: int, offset: int, device=None) -> torch.Tensor:
    """The 32-bit random word of elements start..start+n-1 (as int64), as numerics.h draws it."""
    return words_at(torch.arange(start, start + n, dtype=torch.int64, device=device), seed, offset)


def words_at(i: torch.Tensor, seed: int, offset: int) -> torch.Tensor:
    """numerics.h random_word(i, seed, offset) for an int64 tensor of word indices i >= 0."""
    seed &= (1 << 64) - 1
    offset &= (1 << 64) - 1
    block = i >> 2
    zeros = torch.zeros_like(block)
    ctr = [block & _M32, (block >> 32) & _M32, zeros + (offset & _M32), zeros + (offset >> 32)]
    words = torch.stack(philox4x32(ctr, seed & _M32, seed >> 32), dim=-1)
    return words.gather(-1, (i & 3).unsqueeze(-1)).squeeze(-1)


def cast(x: torch.Tensor, fmt: FloatFormat, rounding: Rounding, saturate: bool, sr_bits: int,
         seed: int, offset: int, words: torch.Tensor | None = None) -> torch.Tensor:
    """The cast of numerics.h cast_bits, on a float32 tensor; returns a new float32 tensor.
    ``words``: element i's random word (default: word i of (seed, offset))."""
    u = _u32(x).reshape(-1)
    sign = u & _SIGN
    a = u ^ sign
    M, eq, ee, qexp, d = _split(a, fmt)
    dc = d.clamp(max=25)
    r = M >> dc
    rem = M & ((1 << dc) - 1)
    twice, quantum = rem << 1, 1 << dc
    lsb = (r & 1) if fmt.man else (r & (ee + fmt.bias) & 1)
    if rounding is Rounding.NEAREST:
        up = (twice > quantum) | ((twice == quantum) & (lsb == 1))
    elif rounding is Rounding.NEAREST_AWAY:
        up = (twice >= quantum) & (rem != 0)
    elif rounding is Rounding.ODD:
        up = (rem != 0) & (lsb == 0)
    elif rounding is Rounding.STOCHASTIC:
        frac = torch.where(d <= 32, rem << (32 - d).clamp(min=0), rem >> (d - 32).clamp(min=0, max=63)) & _M32
        mask = (_M32 << (32 - sr_bits)) & _M32
        rand = words.reshape(-1) if words is not None else random_words(0, u.numel(), seed, offset, device=u.device)
        up = (frac & mask) + (rand & mask) > _M32
    elif rounding is Rounding.TOWARD_ZERO:
        up = torch.zeros_like(r, dtype=torch.bool)
    else:
        away = (sign == 0) if rounding is Rounding.UP else (sign != 0)
        up = (rem != 0) & away
    mag = _compose(r + up.to(torch.int64), qexp)
    mag = _finish_overflow(mag, sign, fmt, rounding, saturate)  # 3a., 3b.
    mag = torch.where(a == _INF, _outward(fmt, saturate), mag)  # 2. (an outward max is never flushed)
    res = _convention(sign, mag, a, fmt)  # 4. a NaN from an fn overflow keeps the sign too
    res = torch.where(a > _INF, u, res)
    return _bits_to_float(res).reshape(x.shape)


def encode_values(v: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Codes (int64) of float32 values that are already values of ``fmt`` (numerics.h encode_value_bits)."""
    u = _u32(v).reshape(-1)
    sign_code = torch.where(u >= _SIGN, 1 << (fmt.exp + fmt.man), 0) if fmt.signed else torch.zeros_like(u)
    a = u & 0x7FFFFFFF
    M, eq, ee, qexp, d = _split(a, fmt)
    code_sub = (1 << fmt.man) if fmt.specials is Specials.FNU else 0  # FNU: field 0 is a normal binade
    code = sign_code | ((M >> d.clamp(max=25)) + ((ee - fmt.emin) << fmt.man) - code_sub)
    code = torch.where(a == _INF, sign_code | (fmt.inf_code or 0), code)
    nan = fmt.nan_code or 0
    code = torch.where(a > _INF, nan if _nan_fixed(fmt) else sign_code | nan, code)
    return code.reshape(v.shape)


def _nan_fixed(fmt: FloatFormat) -> bool:
    """Whether NaN has one code whatever its sign (numerics.h Format::nan_fixed)."""
    return not fmt.signed or fmt.specials in (Specials.FNUZ, Specials.P3109)


def decode(codes: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """float32 values of codes given as int64 (numerics.h decode_bits)."""
    width = fmt.exp + fmt.man
    c = codes.reshape(-1).to(torch.int64) & ((1 << (width + int(fmt.signed))) - 1)
    sign = torch.where((c >> width) & 1 == 1, _SIGN, 0)
    mag = c & ((1 << width) - 1)
    field, frac = mag >> fmt.man, mag & ((1 << fmt.man) - 1)
    no_zero = fmt.specials is Specials.FNU
    r = torch.where((field != 0) | no_zero, frac | (1 << fmt.man), frac)
    val = _compose(r, (field if no_zero else field.clamp(min=1)) - fmt.bias - fmt.man)
    if fmt.specials is Specials.IEEE:
        top = field == (1 << fmt.exp) - 1
        val = torch.where(top, torch.where(frac != 0, _QNAN, _INF), val)
    elif fmt.specials in (Specials.FN, Specials.FNU):
        val = torch.where(mag == (1 << width) - 1, _QNAN, val)
    elif fmt.specials is Specials.P3109:
        val = torch.where(mag == fmt.inf_code, _INF, val)
    out = sign | val
    if _nan_fixed(fmt) and fmt.nan_code is not None:
        out = torch.where(c == fmt.nan_code, _QNAN, out)
    return _bits_to_float(out).reshape(codes.shape)


# ------------------------------------------------------------------------------------------
# Exact arithmetic rounded once (numerics.h, section "Exact arithmetic rounded once"): the same
# Wide values (S < 2^62 fits int64), the same steps.
def _top_bit(S: torch.Tensor) -> torch.Tensor:
    """Position of the highest set bit of S > 0 (float64 may round S up to the next power of 2)."""
    t = torch.frexp(S.to(torch.float64))[1].to(torch.int64) - 1
    return t - ((S >> t.clamp(min=0)) == 0).to(torch.int64)


def _wide_of(u: torch.Tensor):
    a = u & 0x7FFFFFFF
    field = a >> 23
    S = (a & 0x7FFFFF) | ((field != 0).to(torch.int64) << 23)
    return S, field.clamp(min=1) - 150, torch.zeros_like(S), u & _SIGN


def _wide_mul(ua, ub):
    Sa, ea, _, _ = _wide_of(ua)
    Sb, eb, _, _ = _wide_of(ub)
    return Sa * Sb, ea + eb, torch.zeros_like(Sa), (ua ^ ub) & _SIGN


def _wide_add(x, y):
    """Vectorized wide_add; zero operands handled by the caller's selects."""
    Sx, ex, _, sx = x
    Sy, ey, _, sy = y
    tx = torch.where(Sx > 0, _top_bit(Sx.clamp(min=1)) + ex, -(1 << 20))
    ty = torch.where(Sy > 0, _top_bit(Sy.clamp(min=1)) + ey, -(1 << 20))
    swap = ty > tx
    Sx, Sy = torch.where(swap, Sy, Sx), torch.where(swap, Sx, Sy)
    ex, ey = torch.where(swap, ey, ex), torch.where(swap, ex, ey)
    sx, sy = torch.where(swap, sy, sx), torch.where(swap, sx, sy)
    sh = 60 - _top_bit(Sx.clamp(min=1))
    X = Sx << sh
    e = ex - sh
    k = e - ey
    kc = k.clamp(min=0, max=62)
    Y = torch.where(k <= 0, Sy << (-k).clamp(min=0, max=62), Sy >> kc)
    sticky = torch.where(k <= 0, 0, ((Sy & ((1 << kc) - 1)) != 0).to(torch.int64))
    same = sx == sy
    S = torch.where(same, X + Y, torch.where(Y > X, Y - X, X - Y - sticky))
    sign = torch.where(same | (Y <= X), sx, sy)
    # 1. zero operands: the other one
    S = torch.where(Sx == 0, Sy, torch.where(Sy == 0, Sx, S))
    e = torch.where(Sx == 0, ey, torch.where(Sy == 0, ex, e))
    sticky = torch.where((Sx == 0) | (Sy == 0), 0, sticky)
    sign = torch.where(Sx == 0, sy, torch.where(Sy == 0, sx, sign))
    return S, e, sticky, sign


def _round_wide(w, fmt: FloatFormat, rounding: Rounding, saturate: bool, rand) -> torch.Tensor:
    """Float32 bits (int64) of rounding Wide values with S > 0 (entries with S == 0 are garbage)."""
    S, e, sticky, sign = w
    E = _top_bit(S.clamp(min=1)) + e
    ee = E.clamp(min=fmt.emin)
    qexp = ee - fmt.man
    d = qexp - e
    dc = d.clamp(min=1, max=62)
    rem = torch.where(d > 0, S & ((1 << dc) - 1), 0)
    half = 1 << (dc - 1)
    r = torch.where(d > 0, S >> dc, S << (-d).clamp(min=0, max=62))
    lsb = (r & 1) if fmt.man else (r & (ee + fmt.bias) & 1)
    if rounding is Rounding.NEAREST:
        tie = (rem == half) & (d > 0) & (d <= 62)
        up = ((rem > half) & (d <= 62)) | (tie & (sticky == 1)) | (tie & (sticky == 0) & (lsb == 1))
    elif rounding is Rounding.NEAREST_AWAY:
        up = (rem >= half) & (d > 0) & (d <= 62)
    elif rounding is Rounding.ODD:
        up = (d > 0) & ((rem != 0) | (sticky == 1)) & (lsb == 0)
    elif rounding is Rounding.STOCHASTIC:
        frac = torch.where(d <= 32, rem << (32 - d).clamp(min=0, max=32), rem >> (d - 32).clamp(min=0, max=62))
        mask = (_M32 << (32 - rand[1])) & _M32
        up = (d > 0) & (((frac & _M32 & mask) + (rand[0] & mask)) > _M32)
    elif rounding is Rounding.TOWARD_ZERO:
        up = torch.zeros_like(S, dtype=torch.bool)
    else:
        away = (sign == 0) if rounding is Rounding.UP else (sign != 0)
        up = (d > 0) & ((rem != 0) | (sticky == 1)) & away
    mag = _compose(r + up.to(torch.int64), qexp.clamp(max=128))
    mag = _finish_overflow(mag, sign, fmt, rounding, saturate)
    return _convention(sign, mag, torch.ones_like(mag), fmt)


def _outward(fmt: FloatFormat, saturate: bool) -> int:
    """What an outward overflow or an infinite input becomes (numerics.h Format::outward_bits)."""
    if saturate or fmt.specials is Specials.FINITE:
        return _max_bits(fmt)
    return _INF if fmt.specials in (Specials.IEEE, Specials.P3109) else _QNAN


def _convention(sign, mag, a, fmt: FloatFormat):
    """numerics.h convention_bits: sign | mag with no -0 (fnuz, p3109, unsigned), no zero (fnu:
    magnitudes below 2^emin become 2^emin, a zero input NaN) and unsigned (negative inputs NaN)."""
    if fmt.has_negative_zero:
        return sign | mag
    s = torch.where(mag == 0, 0, sign)
    nan = torch.zeros_like(mag, dtype=torch.bool)
    if fmt.specials is Specials.FNU:
        mag = torch.where(mag < _min_normal_bits(fmt), _min_normal_bits(fmt), mag)
        nan = a == 0
    if not fmt.signed:
        nan = nan | ((sign != 0) & (a != 0))
    return torch.where(nan, _QNAN, s | mag)


def _finish_overflow(mag, sign, fmt: FloatFormat, rounding: Rounding, saturate: bool):
    """Steps 3a (overflow) and 3b (flush) of cast_bits on magnitude bits."""
    max_bits, outward = _max_bits(fmt), _outward(fmt, saturate)
    inward = {
        Rounding.TOWARD_ZERO: torch.ones_like(sign, dtype=torch.bool),
        Rounding.ODD: torch.ones_like(sign, dtype=torch.bool),
        Rounding.UP: sign != 0,
        Rounding.DOWN: sign == 0,
    }.get(rounding, torch.zeros_like(sign, dtype=torch.bool))
    mag = torch.where(mag > max_bits, torch.where(inward, max_bits, outward), mag)
    if not fmt.subnormals:
        mag = torch.where(mag < _min_normal_bits(fmt), 0, mag)
    return mag


def arith(op: str, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None, fmt: FloatFormat, rounding: Rounding,
          saturate: bool, sr_bits: int, seed: int, offset: int) -> torch.Tensor:
    """numerics.h mul_bits / add_bits / fma_bits (op "mul", "add", "fma": c + a*b) on same-shape
    float32 tensors; element i uses random word i."""
    ua, ub = _u32(a).reshape(-1), _u32(b).reshape(-1)
    uc = _u32(c).reshape(-1) if c is not None else None
    n = ua.numel()
    words = (random_words(0, n, seed, offset, device=ua.device) if rounding is Rounding.STOCHASTIC
             else torch.zeros(n, dtype=torch.int64, device=ua.device))
    return _bits_to_float(arith_bits(op, ua, ub, uc, fmt, rounding, saturate, sr_bits, words)).reshape(a.shape)


def arith_bits(op: str, ua: torch.Tensor, ub: torch.Tensor, uc: torch.Tensor | None, fmt: FloatFormat,
               rounding: Rounding, saturate: bool, sr_bits: int, words: torch.Tensor) -> torch.Tensor:
    """arith on float32 bit patterns (1-d int64 tensors); element i uses random word words[i]."""
    rand = (words, sr_bits)
    fa, fb = _bits_to_float(ua), _bits_to_float(ub)
    fin = (ua & 0x7FFFFFFF < _INF) & (ub & 0x7FFFFFFF < _INF)
    if op == "mul":
        special = fa * fb
        w = _wide_mul(ua, ub)
        zero = _convention(w[3], torch.zeros_like(ua), torch.zeros_like(ua), fmt)
    else:
        if op == "add":
            w = _wide_add(_wide_of(ua), _wide_of(ub))
            special = fa + fb
            zs = (ua & _SIGN, ub & _SIGN)
        else:
            p = _wide_mul(ua, ub)
            w = _wide_add(_wide_of(uc), p)
            special = torch.where(fin, _bits_to_float(uc), _bits_to_float(uc) + fa * fb)
            fin = fin & (uc & 0x7FFFFFFF < _INF)
            zs = (uc & _SIGN, p[3])
        down = rounding is Rounding.DOWN
        zero = torch.where(zs[0] == zs[1], zs[0], _SIGN if down else 0)
        zero = _convention(zero, torch.zeros_like(ua), torch.zeros_like(ua), fmt)
    rounded = _round_wide(w, fmt, rounding, saturate, rand)
    res = torch.where(w[0] == 0, zero, rounded)
    # non-finite operands: float32 arithmetic, then the cast (same random word)
    special_cast = cast(special, fmt, rounding, saturate, sr_bits, 0, 0, words=words).reshape(-1)
    return torch.where(fin, res, _u32(special_cast))


def matmul(a: torch.Tensor, b: torch.Tensor, mul: FloatFormat | None, acc: FloatFormat, kahan: bool, block: int,
           rounding: Rounding, saturate: bool, sr_bits: int, seed: int, offset: int) -> torch.Tensor:
    """numerics.h dot_step for every output at once: a (B, M, K) and b (B, K, N) float32; a loop
    over k, vectorized over the B*M*N outputs; the same order, roundings and random words."""
    B, M, K = a.shape
    N = b.shape[2]
    dev = a.device
    ua = _u32(a)  # (B, M, K)
    ub = _u32(b)  # (B, K, N)
    n = B * M * N
    o = torch.arange(n, dtype=torch.int64, device=dev)
    zeros = torch.zeros(n, dtype=torch.int64, device=dev)
    sto = rounding is Rounding.STOCHASTIC

    def words(k: int, j: int) -> torch.Tensor:
        return words_at((o * K + k) * 8 + j, seed, offset) if sto else zeros

    def add(x, y, j):
        return arith_bits("add", x, y, None, acc, rounding, saturate, sr_bits, words(k, j))

    def term(x, j):  # round_acc(x + P): P rounded to mul (words j-1, j) or exact (word j)
        if mul is not None:
            p = arith_bits("mul", ak, bk, None, mul, rounding, saturate, sr_bits, words(k, 0))
            return add(x, p, j)
        return arith_bits("fma", ak, bk, x, acc, rounding, saturate, sr_bits, words(k, j))

    def kahan_add(s, c, y, j):
        t = add(s, y, j)
        ts = add(t, s ^ _SIGN, j + 1)
        return t, add(ts, y ^ _SIGN, j + 2)

    s, c, bs = zeros.clone(), zeros.clone(), zeros.clone()
    for k in range(K):
        ak = ua[:, :, k].unsqueeze(2).expand(B, M, N).reshape(-1)
        bk = ub[:, k, :].unsqueeze(1).expand(B, M, N).reshape(-1)
        if block:
            bs = term(bs, 1)
            if (k + 1) % block == 0 or k + 1 == K:
                if kahan:
                    y = add(bs, c ^ _SIGN, 4)
                    s, c = kahan_add(s, c, y, 5)
                else:
                    s = add(s, bs, 4)
                bs = zeros.clone()
        elif kahan:
            y = term(c ^ _SIGN, 1)
            s, c = kahan_add(s, c, y, 2)
        else:
            s = term(s, 1)
    return _bits_to_float(s).reshape(B, M, N)
