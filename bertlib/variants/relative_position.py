"""Relative position embeddings, ``relative_key`` and ``relative_key_query`` (chapter 13, *Anatomy of Hugging
Face's attention*).

Shaw, Uszkoreit & Vaswani (2018) let attention see *distances* between tokens instead of absolute positions;
Huang et al. (2020), *Improve Transformer Models with Better Relative Position Embeddings*, give the two variants
that transformers 4.x implemented in ``BertSelfAttention`` with ``config.position_embedding_type``:

- ``relative_key``: ``score(i, j) = (q_i . k_j + q_i . D[i - j]) / sqrt(d)``
- ``relative_key_query``: ``score(i, j) = (q_i . k_j + q_i . D[i - j] + k_j . D[i - j]) / sqrt(d)``

for query position ``i`` and key position ``j`` (HF's code calls them ``l`` and ``r``), where ``D`` is a
per-layer learned table ``distance_embedding`` of ``2 * max_position_embeddings - 1`` rows of width ``head_size``
(row ``i - j + max_position_embeddings - 1``), shared by the heads. Shaw et al. add the distance term on the key
side only (``relative_key``); Huang et al.'s method 4 adds it on both sides (``relative_key_query``). With either
variant the embeddings add no absolute position vector. Transformers 5.x removed both; bertlib keeps them: the formulas
(:mod:`bertlib.model.relative_scores`) are added by :func:`bertlib.self_attention` whenever
``config.position_embedding_type`` asks, so :func:`bertlib.bert_forward` (the one layer loop) runs a relative
model with any attention function but the padding-free one. This module adds the distance tables to a state dict
(:func:`add_distance_embeddings`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import BertConfig

from bertlib.model.checks import check_config
from bertlib.model.relative_scores import distance_embedding_key
from bertlib.model.runtime import normal_init, seeded_generator

__all__ = ["add_distance_embeddings"]


def add_distance_embeddings(state_dict: Mapping[str, torch.Tensor], config: BertConfig, seed: int | None = None,
                            std: float | None = None) -> dict[str, torch.Tensor]:
    """``state_dict`` plus a freshly initialised distance table per layer, ``(2 * max_position_embeddings - 1,
    head_size)``, normal with standard deviation ``std`` (default ``config.initializer_range``, HF's init), on the
    device and in the dtype of the word embeddings. Defined in chapter 13."""
    check_config(config)
    ref = state_dict["embeddings.word_embeddings.weight"]
    g = seeded_generator(seed)
    shape = (2 * config.max_position_embeddings - 1, config.hidden_size // config.num_attention_heads)
    std = config.initializer_range if std is None else std
    out = dict(state_dict)
    for i in range(config.num_hidden_layers):
        out[distance_embedding_key(i)] = normal_init(shape, std, g, dtype=torch.float64).to(ref)
    return out
