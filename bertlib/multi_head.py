"""All heads at once (chapter 5, *All heads, batched*); mirrors HF ``BertSelfAttention``."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from transformers import BertConfig

from .checks import check_config, check_hidden


def transpose_for_scores(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(batch, seq, hidden)`` → ``(batch, heads, seq, head_size)``: split the last dimension into heads and move
    heads next to batch, so one batched matmul serves every head. (The HF 4.x method of the same name.)
    Defined in chapter 5, *All heads, batched*.
    """
    batch, seq, hidden = x.shape
    return x.view(batch, seq, num_heads, hidden // num_heads).permute(0, 2, 1, 3)


def self_attention(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    layer: int = 0,
    training: bool = False,
    attn_implementation: str = "eager",
    head_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Multi-head self-attention of encoder layer ``layer``, every head in one batched matmul.

    ``hidden_states``: ``(batch, seq, hidden)``; ``attention_mask``: additive ``(batch, 1, 1, seq)`` or ``None``.
    Returns the concatenated heads' context ``(batch, seq, hidden)`` and the probabilities
    ``(batch, heads, seq, seq)``. ``attn_implementation="sdpa"`` uses PyTorch's fused
    ``scaled_dot_product_attention`` and returns ``None`` for the probabilities (the fused kernel never forms them).
    ``head_mask``: ``(heads,)`` or ``None`` (HF 4.x's ``head_mask`` for one layer): head ``h``'s probabilities
    (after dropout) are multiplied by ``head_mask[h]``, so 0 silences the head; the returned probabilities are the
    masked ones. Under ``sdpa`` the same product is applied to each head's context (``(p m) V = m (p V)``).
    Defined in chapter 5, *All heads, batched*; ``head_mask`` in chapter 13, *Anatomy of HF attention*.
    """
    check_config(config)
    check_hidden(config, hidden_states)
    if head_mask is not None and tuple(head_mask.shape) != (config.num_attention_heads,):
        raise ValueError(f"head_mask for one layer must have shape ({config.num_attention_heads},) (one factor per "
                         f"head), got {tuple(head_mask.shape)}.")
    p = f"encoder.layer.{layer}.attention.self."
    heads = config.num_attention_heads
    q, k, v = (
        transpose_for_scores(F.linear(hidden_states, state_dict[p + n + ".weight"], state_dict[p + n + ".bias"]), heads)
        for n in ("query", "key", "value")
    )  # (batch, heads, seq, head_size) each
    dropout = config.attention_probs_dropout_prob if training else 0.0
    if attn_implementation == "sdpa":
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=dropout)
        probs = None
        if head_mask is not None:
            context = context * head_mask.to(context.dtype)[:, None, None]
    elif attn_implementation == "eager":
        # QK^T/sqrt(d), with the scale applied to q: (seq, head_size) numbers to scale instead of (seq, seq), a
        # quarter of the work at 128 tokens and head size 32, the same product up to rounding (appendix 14).
        scores = (q / math.sqrt(q.shape[-1])) @ k.transpose(-1, -2)  # (batch, heads, seq, seq)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = scores.softmax(dim=-1)
        if head_mask is None:
            context = F.dropout(probs, dropout, training) @ v  # (batch, heads, seq, head_size)
        else:  # HF 4.x: attention_probs = dropout(probs) * head_mask
            m = head_mask.to(probs.dtype)[:, None, None]  # (heads, 1, 1): broadcast over batch, query, key
            context = (F.dropout(probs, dropout, training) * m) @ v
            probs = probs * m
    else:
        raise ValueError(f"attn_implementation must be 'eager' or 'sdpa', got {attn_implementation!r}.")
    batch, _, seq, _ = context.shape
    return context.permute(0, 2, 1, 3).reshape(batch, seq, config.hidden_size), probs
