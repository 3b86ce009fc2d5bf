"""The distance terms of relative position attention (chapter 13): what :func:`bertlib.self_attention` adds to the
scores when ``config.position_embedding_type`` is ``relative_key`` or ``relative_key_query``. The chapter's module,
with the distance tables and the story, is :mod:`bertlib.variants.relative_position`; these names live here, below
:mod:`bertlib.model.multi_head`, so that self-attention can use them without importing the chapter's module (which
uses self-attention).
"""

from __future__ import annotations

import torch

from bertlib.model.checks import RELATIVE_TYPES


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
