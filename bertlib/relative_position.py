"""Relative position embeddings, ``relative_key`` and ``relative_key_query`` (chapter 13, *Anatomy of Hugging
Face's attention*).

Shaw, Uszkoreit & Vaswani (2018) let attention see *distances* between tokens instead of absolute positions;
Huang et al. (2020), *Improve Transformer Models with Better Relative Position Embeddings*, give the two variants
that transformers 4.x implemented in ``BertSelfAttention`` with ``config.position_embedding_type``:

- ``relative_key``: ``score(l, r) = (q_l . k_r + q_l . D[l - r]) / sqrt(d)``
- ``relative_key_query``: ``score(l, r) = (q_l . k_r + q_l . D[l - r] + k_r . D[l - r]) / sqrt(d)``

where ``D`` is a per-layer learned table ``distance_embedding`` of ``2 * max_position_embeddings - 1`` rows of
width ``head_size`` (row ``l - r + max_position_embeddings - 1``), shared by the heads. With either variant the
embeddings add no absolute position vector. Transformers 5.x removed both; this module keeps them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from transformers import BertConfig

from .attention import extended_attention_mask
from .checks import check_config, check_hidden, check_inputs, check_state_dict
from .encoder import BertForwardOutput, expand_head_mask
from .layer import attention_output, feed_forward
from .layer_norm import layer_norm
from .multi_head import transpose_for_scores
from .pooler import pooler

#: The two ``position_embedding_type`` values this module implements (``"absolute"`` is BERT's default).
RELATIVE_TYPES = ("relative_key", "relative_key_query")


def _kind(config: BertConfig) -> str:
    kind = getattr(config, "position_embedding_type", "absolute")
    if kind not in RELATIVE_TYPES:
        raise ValueError(f"config.position_embedding_type must be one of {RELATIVE_TYPES} for relative attention, "
                         f"got {kind!r}; set it on the config (BertConfig(position_embedding_type='relative_key')).")
    return kind


def _as_absolute(config: BertConfig) -> BertConfig:
    """A shallow copy saying ``absolute``, for the shared shape checks (which reject any other position type)."""
    view = copy.copy(config)
    view.position_embedding_type = "absolute"
    return view


def distance_embedding_key(layer: int) -> str:
    """The state-dict key of layer ``layer``'s distance table (HF 4.x's name)."""
    return f"encoder.layer.{layer}.attention.self.distance_embedding.weight"


def relative_distance(query_length: int, key_length: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``distance[l, r] = l - r``, ``(query_length, key_length)`` integers: positive when the key lies to the left
    of the query. Defined in chapter 13."""
    return torch.arange(query_length, device=device)[:, None] - torch.arange(key_length, device=device)[None, :]


def relative_position_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    distance_embedding: torch.Tensor,
    max_position_embeddings: int,
    position_embedding_type: str,
) -> torch.Tensor:
    """The position terms added to ``Q K^T`` *before* the ``1/sqrt(d)`` scaling (as HF 4.x adds them).

    ``query``: ``(batch, heads, l, d)``; ``key``: ``(batch, heads, r, d)``; ``distance_embedding``:
    ``(2 * max_position_embeddings - 1, d)``. ``E = distance_embedding[l - r + max_position_embeddings - 1]`` is
    ``(l, r, d)``; ``relative_key`` returns ``einsum("bhld,lrd->bhlr", query, E)``; ``relative_key_query`` adds
    ``einsum("bhrd,lrd->bhlr", key, E)``. Returns ``(batch, heads, l, r)``. Defined in chapter 13.
    """
    if position_embedding_type not in RELATIVE_TYPES:
        raise ValueError(f"position_embedding_type must be one of {RELATIVE_TYPES}, got {position_embedding_type!r}.")
    q_len, k_len = query.shape[-2], key.shape[-2]
    if max(q_len, k_len) > max_position_embeddings:
        raise ValueError(f"sequence length {max(q_len, k_len)} exceeds max_position_embeddings="
                         f"{max_position_embeddings}: the distance table has no row for longer distances.")
    expected = (2 * max_position_embeddings - 1, query.shape[-1])
    if tuple(distance_embedding.shape) != expected:
        raise ValueError(f"distance_embedding must have shape {expected} (2 * max_position_embeddings - 1, "
                         f"head_size), got {tuple(distance_embedding.shape)}.")
    distance = relative_distance(q_len, k_len, device=query.device)
    table = distance_embedding[distance + max_position_embeddings - 1].to(query.dtype)  # (l, r, d)
    scores = torch.einsum("bhld,lrd->bhlr", query, table)
    if position_embedding_type == "relative_key_query":
        scores = scores + torch.einsum("bhrd,lrd->bhlr", key, table)
    return scores


def relative_self_attention(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    layer: int = 0,
    training: bool = False,
    head_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """HF 4.x ``BertSelfAttention.forward`` with ``config.position_embedding_type`` ``relative_key`` or
    ``relative_key_query``: ``softmax((Q K^T + rel) / sqrt(d) + mask)``, dropout, ``* head_mask``, ``@ V``.

    ``hidden_states``: ``(batch, seq, hidden)``; ``attention_mask``: additive ``(batch, 1, 1, seq)``;
    ``head_mask``: ``(heads,)`` or ``None``. Returns the context ``(batch, seq, hidden)`` and the probabilities
    ``(batch, heads, seq, seq)``. Reads ``encoder.layer.{layer}.attention.self.distance_embedding.weight``.
    Defined in chapter 13, *Anatomy of Hugging Face's attention*.
    """
    kind = _kind(config)
    check_hidden(_as_absolute(config), hidden_states)
    p = f"encoder.layer.{layer}.attention.self."
    heads = config.num_attention_heads
    q, k, v = (transpose_for_scores(F.linear(hidden_states, state_dict[p + n + ".weight"], state_dict[p + n + ".bias"]),
                                    heads) for n in ("query", "key", "value"))  # (batch, heads, seq, d)
    scores = q @ k.transpose(-1, -2)  # (batch, heads, seq, seq)
    scores = scores + relative_position_scores(q, k, state_dict[distance_embedding_key(layer)],
                                               config.max_position_embeddings, kind)
    scores = scores / math.sqrt(q.shape[-1])
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = scores.softmax(dim=-1)
    dropped = F.dropout(probs, config.attention_probs_dropout_prob, training)
    if head_mask is not None:
        m = head_mask.to(probs.dtype)[:, None, None]
        dropped, probs = dropped * m, probs * m
    context = dropped @ v
    batch, _, seq, _ = context.shape
    return context.permute(0, 2, 1, 3).reshape(batch, seq, config.hidden_size), probs


def relative_embeddings(state_dict: Mapping[str, torch.Tensor], config: BertConfig, input_ids: torch.Tensor,
                        token_type_ids: torch.Tensor | None = None, *, training: bool = False) -> torch.Tensor:
    """``LayerNorm(word + token_type)``: BERT's embeddings *without* the absolute position vector (HF 4.x adds
    ``position_embeddings`` only when ``position_embedding_type == "absolute"``). ``(batch, seq)`` →
    ``(batch, seq, hidden)``. Defined in chapter 13."""
    p = "embeddings."
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    x = state_dict[p + "word_embeddings.weight"][input_ids]
    x = x + state_dict[p + "token_type_embeddings.weight"][token_type_ids]
    x = layer_norm(x, state_dict[p + "LayerNorm.weight"], state_dict[p + "LayerNorm.bias"], config.layer_norm_eps)
    return F.dropout(x, config.hidden_dropout_prob, training)


def relative_bert_forward(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    *,
    training: bool = False,
    head_mask: torch.Tensor | None = None,
) -> BertForwardOutput:
    """The whole BERT forward pass with relative position attention in every layer (HF 4.x ``BertModel`` with
    ``position_embedding_type`` ``relative_key``/``relative_key_query``). ``state_dict``: ``BertModel`` keys plus
    one ``distance_embedding`` table per layer (:func:`add_distance_embeddings`). Inputs ``(batch, seq)``;
    ``head_mask`` as in :func:`bertlib.bert_forward`. Defined in chapter 13."""
    _kind(config)
    check_state_dict({k: v for k, v in state_dict.items() if "distance_embedding" not in k}, _as_absolute(config))
    keys = [distance_embedding_key(i) for i in range(config.num_hidden_layers)]
    missing = [k for k in keys if k not in state_dict]
    if missing:
        raise ValueError(f"state_dict lacks the distance tables {missing[:2]}...; add them with "
                         "bertlib.relative_position.add_distance_embeddings(state_dict, config).")
    check_inputs(_as_absolute(config), input_ids, attention_mask, token_type_ids)
    head_mask = expand_head_mask(config, head_mask)
    x = relative_embeddings(state_dict, config, input_ids, token_type_ids, training=training)
    mask = None if attention_mask is None else extended_attention_mask(attention_mask, x.dtype)
    all_hidden, all_attn = [x], []
    for layer in range(config.num_hidden_layers):
        context, probs = relative_self_attention(state_dict, config, x, mask, layer=layer, training=training,
                                                 head_mask=None if head_mask is None else head_mask[layer])
        attn = attention_output(state_dict, config, context, x, layer=layer, training=training)
        x = feed_forward(state_dict, config, attn, layer=layer, training=training)
        all_hidden.append(x)
        all_attn.append(probs)
    return BertForwardOutput(last_hidden_state=x, pooler_output=pooler(state_dict, config, x),
                             hidden_states=tuple(all_hidden), attentions=tuple(all_attn))


def add_distance_embeddings(state_dict: Mapping[str, torch.Tensor], config: BertConfig, seed: int = 0,
                            std: float | None = None) -> dict[str, torch.Tensor]:
    """``state_dict`` plus a freshly initialised distance table per layer, ``(2 * max_position_embeddings - 1,
    head_size)``, normal with standard deviation ``std`` (default ``config.initializer_range``, HF's init), on the
    device and in the dtype of the word embeddings. Defined in chapter 13."""
    check_config(_as_absolute(config))
    ref = state_dict["embeddings.word_embeddings.weight"]
    g = torch.Generator().manual_seed(seed)
    shape = (2 * config.max_position_embeddings - 1, config.hidden_size // config.num_attention_heads)
    std = config.initializer_range if std is None else std
    out = dict(state_dict)
    for i in range(config.num_hidden_layers):
        out[distance_embedding_key(i)] = (torch.randn(shape, generator=g, dtype=torch.float64) * std).to(ref)
    return out
