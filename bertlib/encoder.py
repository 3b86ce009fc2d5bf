"""The N-layer encoder and the whole forward pass (chapter 7, *The encoder loop*); mirrors HF ``BertEncoder``
and ``BertModel.forward``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from transformers import BertConfig

from .attention import extended_attention_mask
from .checks import check_config, check_inputs, check_state_dict
from .embeddings import embeddings
from .layer import encoder_layer
from .pooler import pooler


@dataclass
class BertForwardOutput:
    """What :func:`bert_forward` returns; the fields carry HF's ``BaseModelOutputWithPooling`` names.

    ``last_hidden_state``: ``(batch, seq, hidden)``; ``pooler_output``: ``(batch, hidden)``;
    ``hidden_states``: embeddings then one per layer, ``num_hidden_layers + 1`` tensors ``(batch, seq, hidden)``;
    ``attentions``: one ``(batch, heads, seq, seq)`` per layer (``None`` entries under ``sdpa``).
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]
    attentions: tuple[torch.Tensor | None, ...]


def encoder(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    training: bool = False,
    attn_implementation: str = "eager",
    fused: bool = False,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]:
    """Run ``config.num_hidden_layers`` encoder layers, each feeding the next.

    ``hidden_states``: the embeddings ``(batch, seq, hidden)``; ``attention_mask``: additive ``(batch, 1, 1, seq)``.
    Returns every hidden state (the input first, ``num_hidden_layers + 1`` in all) and every layer's attention
    probabilities. Defined in chapter 7, *The encoder loop*.
    """
    all_hidden, all_attn = [hidden_states], []
    for layer in range(config.num_hidden_layers):
        hidden_states, probs = encoder_layer(state_dict, config, hidden_states, attention_mask, layer=layer,
                                             training=training, attn_implementation=attn_implementation, fused=fused)
        all_hidden.append(hidden_states)
        all_attn.append(probs)
    return tuple(all_hidden), tuple(all_attn)


def bert_forward(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    *,
    training: bool = False,
    attn_implementation: str = "eager",
    fused: bool = False,
) -> BertForwardOutput:
    """BERT's forward pass from raw weights: embeddings → encoder → pooler.

    ``input_ids``, ``attention_mask`` (1 = token, 0 = padding), ``token_type_ids``: ``(batch, seq)``.
    Equals ``transformers.BertModel(...)(input_ids, attention_mask, token_type_ids)`` given the same weights.
    Defined in chapter 7, *The encoder loop*.

    The fast path (appendix 14, *Making it fast*): ``attn_implementation="sdpa"`` (fused attention) and
    ``fused=True`` (one-kernel LayerNorm and GELU): the same math, fewer passes over memory.
    """
    check_config(config)
    check_state_dict(state_dict, config)
    check_inputs(config, input_ids, attention_mask, token_type_ids)
    x = embeddings(state_dict, config, input_ids, token_type_ids, training=training, fused=fused)
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None  # nothing to mask: skip adding zeros (exactly the same result; HF does the same)
    mask = None if attention_mask is None else extended_attention_mask(attention_mask, x.dtype)
    hidden, attn = encoder(state_dict, config, x, mask, training=training, attn_implementation=attn_implementation,
                           fused=fused)
    return BertForwardOutput(
        last_hidden_state=hidden[-1],
        pooler_output=pooler(state_dict, config, hidden[-1]),
        hidden_states=hidden,
        attentions=attn,
    )
