"""The padding-free forward pass (appendix 14, *Making it fast*).

A padded batch ``(batch, seq)`` spends most of its work on padding when posts differ in length: every dense layer,
LayerNorm and GELU runs on every position, real or not. But only attention mixes tokens; everything else acts on each
token alone. So gather the real tokens into one ``(1, tokens, hidden)`` sequence, run every per-token step on it,
and run attention sequence by sequence on its own slice (``cu_seqlens``, as FlashAttention's variable-length kernels
call the offsets). No position is padding, so no mask is needed, and the result equals :func:`bertlib.bert_forward`
on every real token. It is ``bert_forward(..., attn_implementation="unpadded")``: the same layer loop with the
attention function :func:`bertlib.attention_functions.varlen_attention_forward`, the real tokens found by
:func:`unpad` (both in :mod:`bertlib.encoder`, the one layer loop; :func:`bert_forward_unpadded` names the call).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import BertConfig

from .encoder import bert_forward, unpad

__all__ = ["bert_forward_unpadded", "unpad"]


def bert_forward_unpadded(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    *,
    output_hidden_states: bool = False,
    fused: bool = True,
    **kwargs,
):
    """:func:`bertlib.bert_forward` without computing a single padding position: a thin alias of
    ``bert_forward(..., attn_implementation="unpadded", fused=True)`` (same keywords).

    ``input_ids``, ``attention_mask``, ``token_type_ids``: ``(batch, seq)``, padded on either side. Returns
    ``last_hidden_state`` ``(batch, seq, hidden)`` with zeros at padding, ``pooler_output`` ``(batch, hidden)``,
    and, with ``output_hidden_states``, every hidden state in the same padded layout; ``attentions`` are ``None``
    (the fused kernel never forms them).
    """
    return bert_forward(state_dict, config, input_ids, attention_mask, token_type_ids, attn_implementation="unpadded",
                        fused=fused, output_hidden_states=output_hidden_states, **kwargs)
