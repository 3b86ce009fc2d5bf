"""All heads at once (chapter 5, *All heads, batched*); mirrors HF ``BertSelfAttention``.

The one place where the query, key and value projections are computed: the attention itself is a function
chosen by name (:mod:`bertlib.model.attention_functions`), relative positions (chapter 13) enter as an additive bias on
the scores, and a pruned layer (chapter 13) simply has fewer rows in its weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import BertConfig

from bertlib.model.attention_functions import get_attention_function
from bertlib.model.checks import (
    RELATIVE_TYPES,
    check_config,
    check_head_mask,
    check_hidden,
    kept_heads,
    position_embedding_type,
)
from bertlib.model.options import DEFAULT_OPTIONS, ForwardOptions
from bertlib.model.relative_scores import distance_embedding_key, relative_position_scores


def transpose_for_scores(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """``(batch, seq, hidden)`` → ``(batch, heads, seq, head_size)``: split the last dimension into heads and move
    heads next to batch, so one batched matmul serves every head. (The HF 4.x method of the same name.)
    Defined in chapter 5, *All heads, batched*.
    """
    batch, seq, hidden = x.shape
    return x.view(batch, seq, num_heads, hidden // num_heads).permute(0, 2, 1, 3)


def layer_head_mask(config: BertConfig, head_mask: torch.Tensor | None, layer: int) -> torch.Tensor | None:
    """One layer's ``(heads,)`` factors, counted in the *original* head numbering, reduced to the heads the layer
    still has (``config.pruned_heads``, chapter 13). HF 4.x cannot combine ``head_mask`` with pruned heads (a
    broadcast error); here the factors of the pruned heads are simply dropped."""
    if head_mask is None:
        return None
    check_head_mask(config, head_mask, layers=False)
    kept = kept_heads(config, layer)
    return head_mask if len(kept) == config.num_attention_heads else head_mask[kept]


def self_attention(state_dict: Mapping[str, Tensor], config: BertConfig, hidden_states: Tensor,
                   attention_mask: Tensor | None = None, *, layer: int = 0, head_mask: Tensor | None = None,
                   options: ForwardOptions = DEFAULT_OPTIONS) -> tuple[Tensor, Tensor | None]:
    """Multi-head self-attention of encoder layer ``layer``, every head in one batched matmul.

    ``hidden_states``: ``(batch, seq, hidden)``; ``attention_mask``: additive ``(batch, 1, 1, seq)`` (or
    ``(batch, 1, seq, seq)`` with a causal mask) or ``None``. Returns the concatenated heads' context
    ``(batch, seq, kept * head_size)`` and the probabilities ``(batch, kept, seq, seq)``; ``kept`` is
    ``num_attention_heads`` unless ``config.pruned_heads`` removed some of this layer's heads.
    ``head_mask``: ``(heads,)`` or ``None`` (HF 4.x's ``head_mask`` for one layer): head ``h``'s probabilities
    (after dropout) are multiplied by ``head_mask[h]``, so 0 silences the head. With
    ``config.position_embedding_type`` ``relative_key``/``relative_key_query`` (HF 4.x) the distance terms of
    :func:`bertlib.model.relative_scores.relative_position_scores` are added to the scores.
    ``options`` (:class:`bertlib.model.options.ForwardOptions`): ``attn_implementation`` names the attention
    function (:data:`bertlib.model.attention_functions.ATTENTION_FUNCTIONS`; ``"sdpa"`` is PyTorch's fused kernel
    and returns ``None`` for the probabilities), ``training`` turns dropout on, ``check=False`` skips the argument
    checks (:func:`bertlib.encoder` has made them once) and ``attention_kwargs`` go to the attention function.
    Defined in chapter 5, *All heads, batched*; ``head_mask``, pruning and relative positions in chapter 13.
    """
    if options.check:
        check_config(config)
        check_hidden(config, hidden_states)
    attend = get_attention_function(options.attn_implementation)
    head_mask = layer_head_mask(config, head_mask, layer)
    p = f"encoder.layer.{layer}.attention.self."
    d = config.hidden_size // config.num_attention_heads
    weights = [(state_dict[p + n + ".weight"], state_dict[p + n + ".bias"]) for n in ("query", "key", "value")]
    heads = weights[0][0].shape[0] // d  # fewer than config says after pruning
    batch, seq = hidden_states.shape[:2]
    if heads == 0:  # every head pruned: no context at all (the output dense then adds only its bias)
        return hidden_states.new_zeros(batch, seq, 0), None
    q, k, v = (transpose_for_scores(F.linear(hidden_states, w, b), heads) for w, b in weights)  # (b, heads, seq, d)
    kind = position_embedding_type(config)
    if kind in RELATIVE_TYPES:  # HF 4.x: (QK^T + rel) / sqrt(d) + mask, the bias folded into the mask
        rel = relative_position_scores(q, k, state_dict[distance_embedding_key(layer)],
                                       config.max_position_embeddings, kind) * d**-0.5
        attention_mask = rel if attention_mask is None else rel + attention_mask
    dropout = config.attention_probs_dropout_prob if options.training else 0.0
    context, probs = attend(q, k, v, attention_mask, d**-0.5, dropout,
                            **{**options.attention_kwargs, "head_mask": head_mask})
    return context.reshape(batch, seq, heads * d), probs
