"""Attention functions, selected by name (appendix 14, *Making it fast*; chapter 13, *Anatomy of HF attention*).

Hugging Face v5 runs one layer loop and plugs the attention kernel in by name (``ALL_ATTENTION_FUNCTIONS``,
``config._attn_implementation``); bertlib does the same. Every function here takes the projected heads and
returns the context, with HF v5's shapes::

    fn(query, key, value, attention_mask, scaling, dropout=0.0, **kwargs: Unpack[AttentionKwargs]) -> (context, probs)

``query``/``key``/``value``: ``(batch, heads, seq, head_size)``; ``attention_mask``: additive, broadcastable to
``(batch, heads, seq, seq)`` (``(batch, 1, 1, seq)`` for padding, ``(batch, 1, seq, seq)`` with a causal mask), or
``None``; ``scaling``: ``1 / sqrt(head_size)``; ``dropout``: the probability (0 outside training). ``kwargs``: the
typed extras (:class:`bertlib.model.options.AttentionKwargs`), ``head_mask`` (``(heads,)`` factors, HF 4.x) and
the padding-free path's ``cu_seq_lens_q``. ``context``: ``(batch, seq, heads, head_size)``; ``probs``:
``(batch, heads, seq, seq)`` or ``None`` when the kernel never forms them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Unpack

import torch
import torch.nn.functional as F
from torch import Tensor

from bertlib.model.options import AttentionKwargs

AttentionFunction = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def _head_factors(head_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(heads,)`` → ``(heads, 1, 1)``: broadcast over batch, query and key (or query and head_size)."""
    return head_mask.to(dtype)[:, None, None]


def eager_attention_forward(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, scaling: float,
                            dropout: float = 0.0, **kwargs: Unpack[AttentionKwargs]) -> tuple[Tensor, Tensor]:
    """``softmax(Q K^T * scaling + mask)``, dropout, ``* head_mask``, ``@ V``: chapter 5's batched heads.

    The scale is applied to ``query`` (``(seq, head_size)`` numbers instead of ``(seq, seq)``; the same product up
    to rounding, appendix 14). The returned probabilities are the masked ones (HF 4.x). HF v5's
    ``eager_attention_forward``.
    """
    head_mask = kwargs.get("head_mask")
    scores = (query * scaling) @ key.transpose(-1, -2)  # (batch, heads, seq, seq)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = scores.softmax(dim=-1)
    dropped = F.dropout(probs, dropout, dropout > 0.0)
    if head_mask is not None:  # HF 4.x: attention_probs = dropout(probs) * head_mask
        m = _head_factors(head_mask, probs.dtype)
        dropped, probs = dropped * m, probs * m
    return (dropped @ value).transpose(1, 2), probs


def sdpa_attention_forward(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, scaling: float,
                           dropout: float = 0.0, **kwargs: Unpack[AttentionKwargs]) -> tuple[Tensor, None]:
    """PyTorch's fused ``scaled_dot_product_attention``: the probabilities are never formed (``None``).
    ``head_mask`` multiplies each head's context (``(p m) V = m (p V)``). HF v5's ``sdpa_attention_forward``."""
    context = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                             scale=scaling)
    head_mask = kwargs.get("head_mask")
    if head_mask is not None:
        context = context * _head_factors(head_mask, context.dtype)
    return context.transpose(1, 2), None


def head_loop_attention_forward(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                                scaling: float, dropout: float = 0.0,
                                **kwargs: Unpack[AttentionKwargs]) -> tuple[Tensor, Tensor]:
    """Chapter 4's formula, one head at a time: ``softmax(q_h k_h^T * scaling + mask) v_h`` for each head ``h``,
    then the heads side by side. The same numbers as :func:`eager_attention_forward`, as many small matmuls."""
    head_mask, contexts, all_probs = kwargs.get("head_mask"), [], []
    for h in range(query.shape[1]):
        scores = (query[:, h] * scaling) @ key[:, h].transpose(-1, -2)  # (batch, seq, seq)
        if attention_mask is not None:
            scores = scores + attention_mask[:, min(h, attention_mask.shape[1] - 1)]
        probs = scores.softmax(dim=-1)
        dropped = F.dropout(probs, dropout, dropout > 0.0)
        if head_mask is not None:
            dropped, probs = dropped * head_mask[h].to(probs.dtype), probs * head_mask[h].to(probs.dtype)
        contexts.append(dropped @ value[:, h])  # (batch, seq, head_size)
        all_probs.append(probs)
    if not contexts:  # no heads (a layer pruned to nothing)
        batch, _, seq, d = query.shape
        return query.new_zeros(batch, seq, 0, d), query.new_zeros(batch, 0, seq, key.shape[2])
    return torch.stack(contexts, dim=2), torch.stack(all_probs, dim=1)


def varlen_attention_forward(query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, scaling: float,
                             dropout: float = 0.0, **kwargs: Unpack[AttentionKwargs]) -> tuple[Tensor, None]:
    """The padding-free path (appendix 14): ``query``/``key``/``value`` are ``(1, heads, tokens, head_size)``, the
    real tokens of every sequence one after another; ``kwargs["cu_seq_lens_q"]`` (``(batch + 1,)``, FlashAttention's
    ``cu_seqlens``) says where each starts. Each sequence attends within its own slice with the fused kernel; no
    position is padding, so no mask (``is_causal`` for a decoder). Returns ``(1, tokens, heads, head_size)`` and
    ``None``."""
    if attention_mask is not None:
        raise ValueError("the padding-free attention takes no additive mask: it has no padding to hide.")
    if kwargs.get("cu_seq_lens_q") is None:
        raise ValueError("the padding-free attention needs attention_kwargs['cu_seq_lens_q'], the offsets of the "
                         "sequences (bertlib.model.encoder.unpad); bert_forward(attn_implementation='unpadded') "
                         "sets them.")
    bounds = kwargs["cu_seq_lens_q"].tolist()
    out = torch.empty_like(query)
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        s = slice(start, end)
        out[:, :, s] = F.scaled_dot_product_attention(query[:, :, s], key[:, :, s], value[:, :, s], dropout_p=dropout,
                                                      is_causal=kwargs.get("is_causal", False), scale=scaling)
    head_mask = kwargs.get("head_mask")
    if head_mask is not None:
        out = out * _head_factors(head_mask, out.dtype)
    return out.transpose(1, 2), None


#: ``attn_implementation`` name → attention function (HF v5's ``ALL_ATTENTION_FUNCTIONS``).
ATTENTION_FUNCTIONS: dict[str, AttentionFunction] = {
    "eager": eager_attention_forward,
    "sdpa": sdpa_attention_forward,
    "head_loop": head_loop_attention_forward,
    "unpadded": varlen_attention_forward,
}


def get_attention_function(name: str) -> AttentionFunction:
    """The attention function called ``name``; a clear error for any other name."""
    try:
        return ATTENTION_FUNCTIONS[name]
    except (KeyError, TypeError):
        raise ValueError(f"attn_implementation={name!r} is not one of bertlib's attention functions: use 'eager' or "
                         f"'sdpa' (or {', '.join(repr(n) for n in list(ATTENTION_FUNCTIONS)[2:])}).") from None
