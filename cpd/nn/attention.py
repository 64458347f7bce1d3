"""Multi-head attention with emulated GEMMs: the computation of ``F.multi_head_attention_forward``
(what ``nn.MultiheadAttention`` calls) written with caller-supplied ``linear`` and ``gemm``
functions, so that :class:`cpd.nn.emulate` can route every GEMM of it through cpd.

Order (per torch's documentation of ``nn.MultiheadAttention``): the three input projections,
``q @ k^T / sqrt(head_dim)`` per head, the masks (``attn_mask``: boolean True = not allowed, or
added; ``key_padding_mask``: boolean True = ignore, or added; ``is_causal`` without a mask: the
causal mask), softmax in float32 (then rounded to ``softmax`` if given), dropout in training,
``@ v``, the output projection. ``bias_k``/``bias_v``, ``add_zero_attn`` and ``static_k/v`` are
not supported (NotImplementedError).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..formats import FloatFormat
from .layers import quantizer

__all__ = ["multi_head_attention"]


def _additive(mask: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor | None:
    """A boolean mask (True = masked out) or a float mask as an additive float32 mask."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=torch.float32, device=like.device).masked_fill(mask, float("-inf"))
    return mask.float()


def multi_head_attention(query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias, bias_k,
                         bias_v, add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True,
                         key_padding_mask=None, need_weights=True, attn_mask=None, use_separate_proj_weight=False,
                         q_proj_weight=None, k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None,
                         average_attn_weights=True, is_causal=False, *, linear, gemm, softmax=None):
    """``F.multi_head_attention_forward``'s arguments (sequence-first layout), computed with
    ``linear(x, w, b)`` for the projections and ``gemm(a, b)`` for the two attention GEMMs."""
    if bias_k is not None or bias_v is not None or add_zero_attn or static_k is not None or static_v is not None:
        raise NotImplementedError("cpd multi-head attention: bias_k/bias_v, add_zero_attn and static_k/v are not "
                                  "supported")
    unbatched = query.dim() == 2
    if unbatched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    L, N, E = query.shape
    S = key.shape[0]
    H = num_heads
    hd = E // H
    if E != embed_dim_to_check or hd * H != E:
        raise ValueError(f"multi-head attention: embed dim {E} (expected {embed_dim_to_check}) is not divisible by "
                         f"num_heads={H}")
    if use_separate_proj_weight:
        wq, wk, wv = q_proj_weight, k_proj_weight, v_proj_weight
    else:
        wq, wk, wv = in_proj_weight.chunk(3)
    bq = bk = bv = None
    if in_proj_bias is not None:
        bq, bk, bv = in_proj_bias.chunk(3)
    q = linear(query, wq, bq).reshape(L, N, H, hd).permute(1, 2, 0, 3)  # (N, H, L, hd)
    k = linear(key, wk, bk).reshape(S, N, H, hd).permute(1, 2, 0, 3)
    v = linear(value, wv, bv).reshape(S, N, H, hd).permute(1, 2, 0, 3)
    scores = gemm(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))  # (N, H, L, S)
    if attn_mask is None and is_causal:
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=query.device).triu(1)
    m = _additive(attn_mask, scores)
    if m is not None:
        scores = scores + (m.reshape(N, H, L, S) if m.dim() == 3 else m)
    kp = _additive(key_padding_mask, scores)
    if kp is not None:
        scores = scores + kp.reshape(N, 1, 1, S)
    p = torch.softmax(scores.float(), dim=-1)
    if softmax is not None:
        p = quantizer(p, FloatFormat.parse(softmax))
    attn = F.dropout(p, dropout_p, training=True) if training and dropout_p > 0 else p
    out = gemm(attn.to(v.dtype), v)  # (N, H, L, hd)
    out = linear(out.permute(2, 0, 1, 3).reshape(L, N, E), out_proj_weight, out_proj_bias)
    weights = None
    if need_weights:
        weights = p.mean(dim=1) if average_attn_weights else p
    if unbatched:
        out = out.squeeze(1)
        weights = None if weights is None else weights.squeeze(0)
    return out, weights
