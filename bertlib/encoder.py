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
    ``attentions``: one ``(batch, heads, seq, seq)`` per layer (``None`` entries under ``sdpa``). Each is ``()``
    when :func:`bert_forward` was asked not to keep it (``output_hidden_states=False``, ``output_attentions=False``).
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...]
    attentions: tuple[torch.Tensor | None, ...]


def expand_head_mask(config: BertConfig, head_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``(heads,)`` (the same for every layer) or ``(num_hidden_layers, heads)`` → ``(num_hidden_layers, heads)``;
    ``None`` stays ``None``. HF 4.x's ``get_head_mask``, without its broadcast dimensions (chapter 13)."""
    if head_mask is None:
        return None
    L, H = config.num_hidden_layers, config.num_attention_heads
    if not isinstance(head_mask, torch.Tensor) or not head_mask.is_floating_point():
        raise TypeError("head_mask must be a floating-point torch.Tensor of per-head factors (1.0 keeps a head, "
                        "0.0 switches it off).")
    if tuple(head_mask.shape) == (H,):
        return head_mask.expand(L, H)
    if tuple(head_mask.shape) != (L, H):
        raise ValueError(f"head_mask must have shape ({H},) or ({L}, {H}) (layers, heads), "
                         f"got {tuple(head_mask.shape)}.")
    return head_mask


def encoder(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    training: bool = False,
    attn_implementation: str = "eager",
    fused: bool = False,
    head_mask: torch.Tensor | None = None,
    output_hidden_states: bool = True,
    output_attentions: bool = True,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]:
    """Run ``config.num_hidden_layers`` encoder layers, each feeding the next.

    ``hidden_states``: the embeddings ``(batch, seq, hidden)``; ``attention_mask``: additive ``(batch, 1, 1, seq)``.
    Returns every hidden state (the input first, ``num_hidden_layers + 1`` in all) and every layer's attention
    probabilities. ``head_mask``: ``(num_hidden_layers, heads)`` factors, row ``i`` for layer ``i`` (chapter 13).
    ``output_hidden_states=False`` keeps only the last hidden state (a 1-tuple), ``output_attentions=False`` no
    probabilities (``()``): each layer's tensors can then be freed as soon as the next layer has read them.
    Defined in chapter 7, *The encoder loop*.
    """
    all_hidden, all_attn = [hidden_states], []
    for layer in range(config.num_hidden_layers):
        hidden_states, probs = encoder_layer(state_dict, config, hidden_states, attention_mask, layer=layer,
                                             training=training, attn_implementation=attn_implementation, fused=fused,
                                             head_mask=None if head_mask is None else head_mask[layer],
                                             output_attentions=output_attentions)
        all_hidden.append(hidden_states)
        if output_attentions:
            all_attn.append(probs)
        if not output_hidden_states:
            all_hidden = all_hidden[-1:]  # let the previous layer's output go
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
    head_mask: torch.Tensor | None = None,
    output_hidden_states: bool = True,
    output_attentions: bool = True,
) -> BertForwardOutput:
    """BERT's forward pass from raw weights: embeddings → encoder → pooler.

    ``input_ids``, ``attention_mask`` (1 = token, 0 = padding), ``token_type_ids``: ``(batch, seq)``.
    Equals ``transformers.BertModel(...)(input_ids, attention_mask, token_type_ids)`` given the same weights.
    Defined in chapter 7, *The encoder loop*.

    The fast path (appendix 14, *Making it fast*): ``attn_implementation="sdpa"`` (fused attention) and
    ``fused=True`` (one-kernel LayerNorm and GELU): the same math, fewer passes over memory.

    ``head_mask`` (HF 4.x's argument, chapter 13, *Anatomy of HF attention*): ``(heads,)`` for every layer alike or
    ``(num_hidden_layers, heads)``; head ``h`` of layer ``i`` has its attention probabilities multiplied by the
    factor (0 = the head is switched off). ``None`` (the default) changes nothing.

    ``output_hidden_states`` and ``output_attentions`` (HF's names): the book looks at every intermediate, so both
    default to ``True`` here (HF's ``BertModel`` defaults to ``False``). Pass ``False`` when only the outputs
    matter: the field is then ``()``, and each layer's activations and its ``(batch, heads, seq, seq)``
    probabilities are freed as the pass goes, as in HF (appendix 14 measures the difference).
    """
    check_config(config)
    check_state_dict(state_dict, config)
    check_inputs(config, input_ids, attention_mask, token_type_ids)
    head_mask = expand_head_mask(config, head_mask)
    x = embeddings(state_dict, config, input_ids, token_type_ids, training=training, fused=fused)
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None  # nothing to mask: skip adding zeros (exactly the same result; HF does the same)
    mask = None if attention_mask is None else extended_attention_mask(attention_mask, x.dtype)
    hidden, attn = encoder(state_dict, config, x, mask, training=training, attn_implementation=attn_implementation,
                           fused=fused, head_mask=head_mask, output_hidden_states=output_hidden_states,
                           output_attentions=output_attentions)
    return BertForwardOutput(
        last_hidden_state=hidden[-1],
        pooler_output=pooler(state_dict, config, hidden[-1]),
        hidden_states=hidden if output_hidden_states else (),
        attentions=attn,
    )
