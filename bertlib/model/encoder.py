"""The N-layer encoder and the whole forward pass (chapter 7, *The encoder loop*); mirrors HF ``BertEncoder``
and ``BertModel.forward``.

This is bertlib's only layer loop. Every variant the book builds runs through it: the attention function is
chosen by name (``attn_implementation``: ``"eager"``, ``"sdpa"``, ``"head_loop"``, ``"unpadded"``; see
:mod:`bertlib.model.attention_functions`), and the config decides the rest as in Hugging Face: ``is_decoder`` (a causal
mask), ``position_embedding_type`` (relative positions, HF 4.x) and ``pruned_heads`` (HF 4.x).
:func:`bert_forward` takes HF's keywords; below it, every step gets them as one frozen
:class:`~bertlib.model.options.ForwardOptions`, and only the loop (:func:`encoder`) decides what to keep.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import BertConfig

from bertlib.model.attention import causal_attention_mask, extended_attention_mask
from bertlib.model.attention_functions import get_attention_function
from bertlib.model.checks import (
    POOLER_KEYS,
    RELATIVE_TYPES,
    check_config,
    check_devices,
    check_head_mask,
    check_hidden,
    check_inputs,
    check_state_dict,
    position_embedding_type,
)
from bertlib.model.embeddings import embeddings
from bertlib.model.layer import encoder_layer
from bertlib.model.options import DEFAULT_OPTIONS, AttentionKwargs, ForwardOptions
from bertlib.model.pooler import pooler

#: Keep only the outputs (the last hidden state and the pooled vector): no hidden state per layer, no attention
#: probabilities, as ``transformers.BertModel`` returns by default. ``bert_forward(..., **OUTPUTS_ONLY)``.
OUTPUTS_ONLY = {"output_hidden_states": False, "output_attentions": False}
#: The fast path of appendix 14: fused attention (SDPA), one-kernel LayerNorm and GELU, and only the outputs.
#: The same numbers as the defaults, to float32 rounding. ``bert_forward(..., **FAST)``.
FAST = {"attn_implementation": "sdpa", "fused": True, **OUTPUTS_ONLY}


@dataclass
class BertForwardOutput:
    """What :func:`bert_forward` returns; the fields carry HF's ``BaseModelOutputWithPooling`` names.

    ``last_hidden_state``: ``(batch, seq, hidden)``; ``pooler_output``: ``(batch, hidden)``, or ``None`` without a
    pooler (HF's ``add_pooling_layer=False``); ``hidden_states``: embeddings then one per layer,
    ``num_hidden_layers + 1`` tensors ``(batch, seq, hidden)``; ``attentions``: one ``(batch, heads, seq, seq)`` per
    layer (``None`` entries under ``sdpa``). Each is ``()`` when :func:`bert_forward` was asked not to keep it
    (``output_hidden_states=False``, ``output_attentions=False``).
    """

    last_hidden_state: torch.Tensor
    pooler_output: torch.Tensor | None
    hidden_states: tuple[torch.Tensor, ...]
    attentions: tuple[torch.Tensor | None, ...]


def expand_head_mask(config: BertConfig, head_mask: torch.Tensor | None) -> torch.Tensor | None:
    """``(heads,)`` (the same for every layer) or ``(num_hidden_layers, heads)`` → ``(num_hidden_layers, heads)``;
    ``None`` stays ``None``. HF 4.x's ``get_head_mask``, without its broadcast dimensions (chapter 13). Heads are
    counted in the original numbering, pruned ones included (their factors are dropped)."""
    if head_mask is None:
        return None
    check_head_mask(config, head_mask)
    L, H = config.num_hidden_layers, config.num_attention_heads
    return head_mask.expand(L, H) if tuple(head_mask.shape) == (H,) else head_mask


def encoder(state_dict: Mapping[str, torch.Tensor], config: BertConfig, hidden_states: torch.Tensor,
            attention_mask: torch.Tensor | None = None, *, head_mask: torch.Tensor | None = None,
            options: ForwardOptions = DEFAULT_OPTIONS
            ) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor | None, ...]]:
    """Run ``config.num_hidden_layers`` encoder layers, each feeding the next.

    ``hidden_states``: the embeddings ``(batch, seq, hidden)``; ``attention_mask``: additive ``(batch, 1, 1, seq)``
    (or ``(batch, 1, seq, seq)``). Returns every hidden state (the input first, ``num_hidden_layers + 1`` in all)
    and every layer's attention probabilities. ``head_mask``: ``(heads,)`` or ``(num_hidden_layers, heads)``
    factors, row ``i`` for layer ``i`` (chapter 13). ``options`` (:class:`bertlib.model.options.ForwardOptions`)
    go to every layer; this loop is the one place that reads their output flags: ``output_hidden_states=False``
    keeps only the last hidden state (a 1-tuple), ``output_attentions=False`` no probabilities (``()``), so each
    layer's tensors can be freed as soon as the next layer has read them. ``check=True`` validates the config, the
    weights and the input once, here, not in every layer. Defined in chapter 7, *The encoder loop*.
    """
    if options.check:
        check_config(config)
        check_state_dict(state_dict, config, pooler=False)
        check_hidden(config, hidden_states)
        get_attention_function(options.attn_implementation)
        options = options.replace(check=False)  # checked once, for every layer
    head_mask = expand_head_mask(config, head_mask)
    all_hidden, all_attn = [hidden_states], []
    for layer in range(config.num_hidden_layers):
        hidden_states, probs = encoder_layer(state_dict, config, hidden_states, attention_mask, layer=layer,
                                             head_mask=None if head_mask is None else head_mask[layer],
                                             options=options)
        if options.output_hidden_states:
            all_hidden.append(hidden_states)
        else:
            all_hidden = [hidden_states]  # let the previous layer's output go
        if options.output_attentions:
            all_attn.append(probs)
        del probs  # unless kept, its memory is free for the next layer
    return tuple(all_hidden), tuple(all_attn)


def attention_mask_for(config: BertConfig, attention_mask: torch.Tensor | None, seq: int, dtype: torch.dtype,
                       device: torch.device) -> torch.Tensor | None:
    """The additive mask :func:`bert_forward` gives every layer: the causal one when ``config.is_decoder`` (HF's
    ``create_causal_mask``), else the padding mask (HF's ``create_bidirectional_mask``), or ``None`` when nothing is
    masked (an all-ones mask adds only zeros; HF skips it the same way, with the same one-number read)."""
    if attention_mask is not None and bool(attention_mask.all()):
        attention_mask = None
    if getattr(config, "is_decoder", False):
        return causal_attention_mask(seq, attention_mask, dtype, device)
    return None if attention_mask is None else extended_attention_mask(attention_mask, dtype)


def _validate(state_dict, config, input_ids, attention_mask, token_type_ids, position_ids, *,
              attn_implementation: str, add_pooling_layer: bool | None) -> None:
    """Every check of :func:`bert_forward`, once per call (``check=True``)."""
    check_config(config)
    get_attention_function(attn_implementation)
    if attn_implementation == "unpadded" and position_embedding_type(config) in RELATIVE_TYPES:
        raise ValueError("attn_implementation='unpadded' supports absolute position embeddings only; use 'eager' "
                         f"or 'sdpa' with position_embedding_type={position_embedding_type(config)!r}.")
    check_state_dict(state_dict, config, pooler=add_pooling_layer)
    check_devices(state_dict, input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                  position_ids=position_ids)
    check_inputs(config, input_ids, attention_mask, token_type_ids, position_ids)


def unpad(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Where the real tokens are. ``attention_mask``: ``(batch, seq)`` of 0/1.

    Returns the flat indices of the real tokens into ``batch * seq`` (``(tokens,)``), the offsets ``cu_seqlens``
    (``(batch + 1,)``: sequence ``b`` is rows ``cu_seqlens[b]:cu_seqlens[b+1]`` of the unpadded matrix) and the
    lengths as Python ints.
    """
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    indices = mask.flatten().nonzero().squeeze(1)
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))
    return indices, cu_seqlens, lengths.tolist()


def _unpadded_forward(state_dict, config, input_ids, attention_mask, token_type_ids, position_ids, head_mask,
                      options: ForwardOptions) -> tuple[tuple[torch.Tensor, ...], tuple]:
    """The padding-free path (appendix 14): only the real tokens, as one ``(1, tokens, hidden)`` sequence through
    the same loop, each sequence attending within its own slice (``cu_seq_lens_q``, :class:`AttentionKwargs`);
    hidden states padded back, zeros at padding."""
    batch, seq = input_ids.shape
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    indices, cu_seqlens, lengths = unpad(mask)
    if position_ids is None:
        position_ids = torch.arange(seq, device=input_ids.device)
    position_ids = position_ids.expand(batch, seq)

    def flat(t: torch.Tensor) -> torch.Tensor:  # (batch, seq) -> (1, tokens)
        return t.flatten()[indices][None]

    def pad(x: torch.Tensor) -> torch.Tensor:  # (1, tokens, hidden) -> (batch, seq, hidden), zeros at padding
        out = x.new_zeros(batch * seq, x.shape[-1])
        out[indices] = x[0]
        return out.view(batch, seq, -1)

    longest, offsets = max(lengths, default=0), cu_seqlens.cpu()  # on the CPU: the slices are read without a sync
    extras = AttentionKwargs(cu_seq_lens_q=offsets, cu_seq_lens_k=offsets, max_length_q=longest,
                             max_length_k=longest, is_causal=bool(getattr(config, "is_decoder", False)))
    options = options.replace(attention_kwargs={**options.attention_kwargs, **extras})
    types = None if token_type_ids is None else flat(token_type_ids)
    x = embeddings(state_dict, config, flat(input_ids), types, position_ids=flat(position_ids), options=options)
    hidden, attn = encoder(state_dict, config, x, None, head_mask=head_mask, options=options)
    return tuple(pad(h) for h in hidden), attn


def bert_forward(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    *,
    head_mask: torch.Tensor | None = None,
    training: bool = False,
    attn_implementation: str = "eager",
    fused: bool = False,
    output_hidden_states: bool = True,
    output_attentions: bool = True,
    add_pooling_layer: bool | None = None,
    check: bool = True,
) -> BertForwardOutput:
    """BERT's forward pass from raw weights: embeddings → encoder → pooler.

    ``input_ids``, ``attention_mask`` (1 = token, 0 = padding), ``token_type_ids``, ``position_ids``:
    ``(batch, seq)`` (positions may be ``(1, seq)``). Equals ``transformers.BertModel(...)(input_ids,
    attention_mask, token_type_ids, position_ids)`` given the same weights and config, ``config.is_decoder``
    (causal attention) included. Defined in chapter 7, *The encoder loop*.

    ``attn_implementation``: the attention function by name (:mod:`bertlib.model.attention_functions`): ``"eager"``
    (chapter 5), ``"sdpa"`` (fused, appendix 14), ``"head_loop"`` (chapter 4's one head at a time) or
    ``"unpadded"`` (appendix 14: no padding position is computed; zeros there). ``fused=True``: one-kernel
    LayerNorm and GELU. The config's ``position_embedding_type`` (``relative_key``/``relative_key_query``) and
    ``pruned_heads`` select HF 4.x's relative positions and pruned heads, and ``head_mask`` (HF 4.x) is
    ``(heads,)`` or ``(num_hidden_layers, heads)`` factors on each head's attention probabilities (chapter 13).

    ``output_hidden_states`` and ``output_attentions`` (HF's names): the book looks at every intermediate, so both
    default to ``True`` here (HF's ``BertModel`` defaults to ``False``); with ``False`` the field is ``()`` and
    each layer's activations are freed as the pass goes (appendix 14 measures the difference).
    ``add_pooling_layer``: ``None`` pools when the state dict has the pooler's weights (``BertForMaskedLM`` has
    none), ``False`` never (``pooler_output=None``), ``True`` requires them. ``check=False`` skips the validation
    (once per call; it reads the ids' min and max, a GPU→CPU copy): training loops and the benchmark turn it off.
    """
    if check:
        _validate(state_dict, config, input_ids, attention_mask, token_type_ids, position_ids,
                  attn_implementation=attn_implementation, add_pooling_layer=add_pooling_layer)
    options = ForwardOptions(attn_implementation=attn_implementation, fused=fused, training=training, check=False,
                             output_hidden_states=output_hidden_states, output_attentions=output_attentions)
    if attn_implementation == "unpadded":
        hidden, attn = _unpadded_forward(state_dict, config, input_ids, attention_mask, token_type_ids, position_ids,
                                         head_mask, options)
    else:
        x = embeddings(state_dict, config, input_ids, token_type_ids, position_ids=position_ids, options=options)
        mask = attention_mask_for(config, attention_mask, input_ids.shape[1], x.dtype, x.device)
        hidden, attn = encoder(state_dict, config, x, mask, head_mask=head_mask, options=options)
    pooled = add_pooling_layer if add_pooling_layer is not None else POOLER_KEYS[0] in state_dict
    return BertForwardOutput(last_hidden_state=hidden[-1],
                             pooler_output=pooler(state_dict, config, hidden[-1]) if pooled else None,
                             hidden_states=hidden if output_hidden_states else (), attentions=attn)
