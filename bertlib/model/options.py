"""How a forward pass runs, in one object (chapter 7, *The encoder loop*; appendix 14, *Making it fast*).

:func:`bertlib.bert_forward` takes Hugging Face's keywords (``attn_implementation``, ``output_attentions`` ...), the
ones the book teaches. Below it every step receives them as one frozen :class:`ForwardOptions` instead of a
parameter each, so a new switch is added in one place and cannot be forgotten on the way down. The extras that
only some attention functions read travel inside it as :class:`AttentionKwargs`, a ``TypedDict`` like HF v5's
``**kwargs: Unpack[TransformersKwargs]`` (whose ``FlashAttentionKwargs`` names they keep).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TypedDict

import torch


class AttentionKwargs(TypedDict, total=False):
    """The extras an attention function (:mod:`bertlib.model.attention_functions`) may read; all optional.

    ``head_mask``: ``(heads,)`` factors on one layer's attention probabilities (HF 4.x; chapter 13), set per layer
    by :func:`bertlib.self_attention`. ``cu_seq_lens_q``/``cu_seq_lens_k``: ``(batch + 1,)`` offsets of each
    sequence in a padding-free batch (FlashAttention's ``cu_seqlens``; appendix 14), ``max_length_q``/
    ``max_length_k``: the longest sequence, ``is_causal``: each sequence attends only to earlier tokens (a decoder)
    where no additive mask says so. The names are HF v5's ``FlashAttentionKwargs``.
    """

    head_mask: torch.Tensor | None
    cu_seq_lens_q: torch.Tensor
    cu_seq_lens_k: torch.Tensor
    max_length_q: int
    max_length_k: int
    is_causal: bool


@dataclass(frozen=True)
class ForwardOptions:
    """How :func:`bertlib.encoder`, :func:`bertlib.encoder_layer`, :func:`bertlib.self_attention` and
    :func:`bertlib.embeddings` run; the defaults are the book's formulas, step by step.

    ``attn_implementation``: the attention function by name (``"eager"``, ``"sdpa"``, ``"head_loop"``,
    ``"unpadded"``; :data:`bertlib.ATTENTION_FUNCTIONS`). ``fused``: one-kernel LayerNorm and GELU (appendix 14).
    ``training``: dropout on (HF's ``model.train()``). ``check``: validate the config, weights and inputs once, at
    the top of the call (the steps below it get ``check=False``). ``output_hidden_states``/``output_attentions``:
    what the encoder loop keeps (HF's names; the book keeps both). ``attention_kwargs``: :class:`AttentionKwargs`
    for the attention function. Frozen: derive a variant with :meth:`replace`.
    """

    attn_implementation: str = "eager"
    fused: bool = False
    training: bool = False
    check: bool = True
    output_hidden_states: bool = True
    output_attentions: bool = True
    attention_kwargs: AttentionKwargs = field(default_factory=dict)

    def replace(self, **changes) -> ForwardOptions:
        """A copy with ``changes`` (``dataclasses.replace``), e.g. ``options.replace(check=False)``."""
        return dataclasses.replace(self, **changes)


#: The options every step defaults to: eager attention, plain kernels, no dropout, checks on, every output kept.
DEFAULT_OPTIONS = ForwardOptions()
