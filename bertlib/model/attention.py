"""Scaled dot-product attention for one head, and the padding mask (chapter 4, *Attention, one head*).

Vaswani et al. (2017): ``softmax(Q K^T / sqrt(d) + mask) V``. HF: ``eager_attention_forward``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from transformers import BertConfig

from bertlib.model.checks import check_config, check_hidden


def extended_attention_mask(attention_mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(batch, seq)`` 1/0 mask → ``(batch, 1, 1, seq)`` additive mask: 0 where attended, ``finfo(dtype).min``
    where padded, added to the scores of every head and every query row.

    HF 4.x used ``-10000.0``; both give the same probabilities in float32 (chapter 4 shows where they differ).
    Defined in chapter 4, *Attention, one head*.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (batch, seq), got {tuple(attention_mask.shape)}.")
    mask = attention_mask[:, None, None, :].to(dtype)
    return (1.0 - mask) * torch.finfo(dtype).min


def head_slice(config: BertConfig, head: int) -> slice:
    """The rows of the query/key/value weights (and columns of ``attention.output.dense``) owned by ``head``."""
    check_config(config)
    if not 0 <= head < config.num_attention_heads:
        raise ValueError(f"head must be in [0, {config.num_attention_heads}), got {head}.")
    d = config.hidden_size // config.num_attention_heads
    return slice(head * d, (head + 1) * d)


def attention_head(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    hidden_states: torch.Tensor,
    head: int,
    attention_mask: torch.Tensor | None = None,
    *,
    layer: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention head of encoder layer ``layer``.

    ``hidden_states``: ``(batch, seq, hidden)``; ``attention_mask``: the additive ``(batch, 1, 1, seq)`` mask from
    :func:`extended_attention_mask` (or ``None``). Returns the head's context ``(batch, seq, head_size)`` and its
    probabilities ``(batch, seq, seq)`` (row = query token, column = key token).
    Defined in chapter 4, *Attention, one head*.
    """
    check_hidden(config, hidden_states)
    p = f"encoder.layer.{layer}.attention.self."
    rows = head_slice(config, head)

    def project(name: str) -> torch.Tensor:  # x W_h^T + b_h with this head's rows of the weight
        return F.linear(hidden_states, state_dict[p + name + ".weight"][rows], state_dict[p + name + ".bias"][rows])

    q, k, v = project("query"), project("key"), project("value")  # (batch, seq, head_size) each
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (batch, seq, seq)
    if attention_mask is not None:
        scores = scores + attention_mask[:, 0]  # (batch, 1, seq): broadcast over query rows
    probs = scores.softmax(dim=-1)
    return probs @ v, probs


def causal_attention_mask(seq: int, attention_mask: torch.Tensor | None = None, dtype: torch.dtype = torch.float32,
                          device: torch.device | str | None = None) -> torch.Tensor:
    """The decoder's mask (``config.is_decoder``, HF's ``create_causal_mask``): query ``l`` sees keys ``r <= l``
    that are not padding. ``attention_mask``: ``(batch, seq)`` 1/0 or ``None``. Returns the additive
    ``(batch, 1, seq, seq)`` mask (``(1, 1, seq, seq)`` without padding): 0 where attended, ``finfo(dtype).min``
    elsewhere. Defined in chapter 7, *The encoder loop* (a BERT with ``is_decoder=True`` is a left-to-right model).
    """
    if attention_mask is not None:
        device = attention_mask.device
    allowed = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()[None]  # (1, seq, seq): r <= l
    if attention_mask is not None:
        allowed = allowed & attention_mask.bool()[:, None, :]  # (batch, seq, seq): and r is a real token
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None]
