"""The padding-free forward pass (appendix 14, *Making it fast*).

A padded batch ``(batch, seq)`` spends most of its work on padding when posts differ in length: every dense layer,
LayerNorm and GELU runs on every position, real or not. But only attention mixes tokens; everything else acts on each
token alone. So gather the real tokens into one ``(1, tokens, hidden)`` sequence, run every per-token step on it,
and run attention sequence by sequence on its own slice (``cu_seqlens``, as FlashAttention's variable-length kernels
call the offsets). No position is padding, so no mask is needed, and the result equals :func:`bertlib.bert_forward`
on every real token. It is ``bert_forward(..., attn_implementation="unpadded")``: the same layer loop with the
attention function :func:`bertlib.attention_functions.varlen_attention_forward`, the real tokens found by
:func:`unpad` (both in :mod:`bertlib.encoder`, the one layer loop).
"""

from __future__ import annotations

from .encoder import unpad

__all__ = ["unpad"]


def __getattr__(name: str):
    """``bert_forward_unpadded`` (an old alias of ``bert_forward(..., attn_implementation="unpadded")``) from
    :mod:`bertlib.compat`, which warns; any other missing name is an ``AttributeError`` as usual."""
    if name == "bert_forward_unpadded":
        from . import compat

        return compat.bert_forward_unpadded
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
