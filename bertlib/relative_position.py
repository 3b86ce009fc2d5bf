"""Relative position embeddings, ``relative_key`` and ``relative_key_query`` (chapter 13, *Anatomy of Hugging
Face's attention*).

Shaw, Uszkoreit & Vaswani (2018) let attention see *distances* between tokens instead of absolute positions;
Huang et al. (2020), *Improve Transformer Models with Better Relative Position Embeddings*, give the two variants
that transformers 4.x implemented in ``BertSelfAttention`` with ``config.position_embedding_type``:

- ``relative_key``: ``score(l, r) = (q_l . k_r + q_l . D[l - r]) / sqrt(d)``
- ``relative_key_query``: ``score(l, r) = (q_l . k_r + q_l . D[l - r] + k_r . D[l - r]) / sqrt(d)``

where ``D`` is a per-layer learned table ``distance_embedding`` of ``2 * max_position_embeddings - 1`` rows of
width ``head_size`` (row ``l - r + max_position_embeddings - 1``), shared by the heads. With either variant the
embeddings add no absolute position vector. Transformers 5.x removed both; this module keeps them: the formulas
live here, and :func:`bertlib.self_attention` adds the terms whenever ``config.position_embedding_type`` asks, so
:func:`bertlib.bert_forward` (the one layer loop) runs a relative model with any attention function but the
padding-free one.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import BertConfig

from .checks import RELATIVE_TYPES, check_config, position_embedding_type

__all__ = ["RELATIVE_TYPES", "add_distance_embeddings", "distance_embedding_key", "relative_bert_forward",
           "relative_distance", "relative_embeddings", "relative_position_scores", "relative_self_attention"]


def _kind(config: BertConfig) -> str:
    kind = position_embedding_type(config)
    if kind not in RELATIVE_TYPES:
        raise ValueError(f"config.position_embedding_type must be one of {RELATIVE_TYPES} for relative attention, "
                         f"got {kind!r}; set it on the config (BertConfig(position_embedding_type='relative_key')).")
    return kind


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
    attn_implementation: str = "eager",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """HF 4.x ``BertSelfAttention.forward`` with ``config.position_embedding_type`` ``relative_key`` or
    ``relative_key_query``: ``softmax((Q K^T + rel) / sqrt(d) + mask)``, dropout, ``* head_mask``, ``@ V``.

    A thin alias of :func:`bertlib.self_attention`, which adds the relative terms whenever the config asks for
    them; this name insists that it does. ``hidden_states``: ``(batch, seq, hidden)``; ``attention_mask``: additive
    ``(batch, 1, 1, seq)``; ``head_mask``: ``(heads,)`` or ``None``. Returns the context ``(batch, seq, hidden)``
    and the probabilities ``(batch, heads, seq, seq)``. Reads
    ``encoder.layer.{layer}.attention.self.distance_embedding.weight``. Defined in chapter 13.
    """
    from .multi_head import self_attention  # multi_head imports this module's formulas

    _kind(config)
    return self_attention(state_dict, config, hidden_states, attention_mask, layer=layer, training=training,
                          head_mask=head_mask, attn_implementation=attn_implementation)


def relative_embeddings(state_dict: Mapping[str, torch.Tensor], config: BertConfig, input_ids: torch.Tensor,
                        token_type_ids: torch.Tensor | None = None, *, training: bool = False) -> torch.Tensor:
    """``LayerNorm(word + token_type)``: BERT's embeddings *without* the absolute position vector (HF 4.x adds
    ``position_embeddings`` only when ``position_embedding_type == "absolute"``). ``(batch, seq)`` →
    ``(batch, seq, hidden)``. An alias of :func:`bertlib.embeddings` for a relative config. Defined in chapter 13."""
    from .embeddings import embeddings

    _kind(config)
    return embeddings(state_dict, config, input_ids, token_type_ids, training=training)


def relative_bert_forward(state_dict: Mapping[str, torch.Tensor], config: BertConfig, input_ids: torch.Tensor,
                          attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                          **kwargs):
    """The whole BERT forward pass with relative position attention in every layer (HF 4.x ``BertModel`` with
    ``position_embedding_type`` ``relative_key``/``relative_key_query``). ``state_dict``: ``BertModel`` keys plus
    one ``distance_embedding`` table per layer (:func:`add_distance_embeddings`). A thin alias of
    :func:`bertlib.bert_forward` (same keywords), which follows ``config.position_embedding_type``; this name
    insists on a relative config. Defined in chapter 13."""
    from .encoder import bert_forward

    _kind(config)
    return bert_forward(state_dict, config, input_ids, attention_mask, token_type_ids, **kwargs)


def add_distance_embeddings(state_dict: Mapping[str, torch.Tensor], config: BertConfig, seed: int = 0,
                            std: float | None = None) -> dict[str, torch.Tensor]:
    """``state_dict`` plus a freshly initialised distance table per layer, ``(2 * max_position_embeddings - 1,
    head_size)``, normal with standard deviation ``std`` (default ``config.initializer_range``, HF's init), on the
    device and in the dtype of the word embeddings. Defined in chapter 13."""
    check_config(config)
    ref = state_dict["embeddings.word_embeddings.weight"]
    g = torch.Generator().manual_seed(seed)
    shape = (2 * config.max_position_embeddings - 1, config.hidden_size // config.num_attention_heads)
    std = config.initializer_range if std is None else std
    out = dict(state_dict)
    for i in range(config.num_hidden_layers):
        out[distance_embedding_key(i)] = (torch.randn(shape, generator=g, dtype=torch.float64) * std).to(ref)
    return out
