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
    seed &= (1 << 64) - 1
    offset &= (1 << 64) - 1
    i = torch.arange(start, start + n, dtype=torch.int64, device=device)
    block = i >> 2
    zeros = torch.zeros_like(block)
    ctr = [block & _M32, (block >> 32) & _M32, zeros + (offset & _M32), zeros + (offset >> 32)]
    words = torch.stack(philox4x32(ctr, seed & _M32, seed >> 32), dim=-1)
    return words.gather(-1, (i & 3).unsqueeze(-1)).squeeze(-1)


def cast(x: torch.Tensor, fmt: FloatFormat, rounding: Rounding, saturate: bool, sr_bits: int,
         seed: int, offset: int) -> torch.Tensor:
    """The cast of numerics.h cast_bits, on a float32 tensor; returns a new float32 tensor."""
    u = _u32(x).reshape(-1)
    sign = u & _SIGN
    a = u ^ sign
    M, eq, ee, qexp, d = _split(a, fmt)
    dc = d.clamp(max=25)
    r = M >> dc
    rem = M & ((1 << dc) - 1)
    if rounding is Rounding.NEAREST:
        twice, quantum = rem << 1, 1 << dc
        lsb = (r & 1) if fmt.man else (r & (ee + fmt.bias) & 1)
        up = (twice > quantum) | ((twice == quantum) & (lsb == 1))
    elif rounding is Rounding.STOCHASTIC:
        frac = torch.where(d <= 32, rem << (32 - d).clamp(min=0), rem >> (d - 32).clamp(min=0, max=63)) & _M32
        mask = (_M32 << (32 - sr_bits)) & _M32
        rand = random_words(0, u.numel(), seed, offset, device=u.device)
        up = (frac & mask) + (rand & mask) > _M32
    elif rounding is Rounding.TOWARD_ZERO:
        up = torch.zeros_like(r, dtype=torch.bool)
    else:
        away = (sign == 0) if rounding is Rounding.UP else (sign != 0)
        up = (rem != 0) & away
    mag = _compose(r + up.to(torch.int64), qexp)
    max_bits = _max_bits(fmt)
    if saturate or fmt.specials is Specials.FINITE:
        outward = max_bits
    else:
        outward = _INF if fmt.specials is Specials.IEEE else _QNAN
    inward = {
        Rounding.TOWARD_ZERO: torch.ones_like(sign, dtype=torch.bool),
        Rounding.UP: sign != 0,
        Rounding.DOWN: sign == 0,
    }.get(rounding, torch.zeros_like(sign, dtype=torch.bool))
    ovf = torch.where(inward, max_bits, outward)
    mag = torch.where(mag > max_bits, ovf, mag)
    mag = torch.where(a == _INF, outward, mag)
    if not fmt.subnormals:
        mag = torch.where(mag < _min_normal_bits(fmt), 0, mag)
    res = sign | mag  # a NaN from an fn overflow keeps the sign too
    res = torch.where(a > _INF, u, res)
    return _bits_to_float(res).reshape(x.shape)


def encode_values(v: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """Codes (int64) of float32 values that are already values of ``fmt`` (numerics.h encode_value_bits)."""
    u = _u32(v).reshape(-1)
    sign_code = torch.where(u >= _SIGN, 1 << (fmt.exp + fmt.man), 0)
    a = u & 0x7FFFFFFF
    M, eq, ee, qexp, d = _split(a, fmt)
    code = (M >> d.clamp(max=25)) + ((ee - fmt.emin) << fmt.man)
    code = torch.where(a == _INF, ((1 << fmt.exp) - 1) << fmt.man if fmt.has_inf else 0, code)
    code = torch.where(a > _INF, fmt.nan_code or 0, code)
    return (sign_code | code).reshape(v.shape)


def decode(codes: torch.Tensor, fmt: FloatFormat) -> torch.Tensor:
    """float32 values of codes given as int64 (numerics.h decode_bits)."""
    c = codes.reshape(-1).to(torch.int64)
    width = fmt.exp + fmt.man
    sign = torch.where((c >> width) & 1 == 1, _SIGN, 0)
    mag = c & ((1 << width) - 1)
    field, frac = mag >> fmt.man, mag & ((1 << fmt.man) - 1)
    r = torch.where(field != 0, frac | (1 << fmt.man), frac)
    val = _compose(r, field.clamp(min=1) - fmt.bias - fmt.man)
    if fmt.specials is Specials.IEEE:
        top = field == (1 << fmt.exp) - 1
        val = torch.where(top, torch.where(frac != 0, _QNAN, _INF), val)
    elif fmt.specials is Specials.FN:
        val = torch.where(mag == (1 << width) - 1, _QNAN, val)
    return _bits_to_float(sign | val).reshape(codes.shape)
