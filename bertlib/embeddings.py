"""Word + position + token-type embeddings (chapter 2, *Embeddings*); mirrors HF ``BertEmbeddings``."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from transformers import BertConfig

from .checks import check_inputs
from .layer_norm import layer_norm


def embeddings(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    *,
    training: bool = False,
    fused: bool = False,
) -> torch.Tensor:
    """``LayerNorm(word[input_ids] + position[0..T-1] + token_type[token_type_ids])``.

    ``input_ids``, ``token_type_ids``: ``(batch, seq)`` integers (segment ids default to 0).
    Returns ``(batch, seq, hidden)``. Dropout (``hidden_dropout_prob``) only when ``training``.
    Defined in chapter 2, *Embeddings*; the LayerNorm is chapter 3's.
    """
    check_inputs(config, input_ids, token_type_ids=token_type_ids)
    p = "embeddings."
    seq = input_ids.shape[1]
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    position_ids = torch.arange(seq, device=input_ids.device)
    word = state_dict[p + "word_embeddings.weight"][input_ids]  # (batch, seq, hidden)
    position = state_dict[p + "position_embeddings.weight"][position_ids]  # (seq, hidden), broadcast over batch
    token_type = state_dict[p + "token_type_embeddings.weight"][token_type_ids]  # (batch, seq, hidden)
    x = word + token_type + position  # HF's order of additions, so float rounding matches too
    x = layer_norm(x, state_dict[p + "LayerNorm.weight"], state_dict[p + "LayerNorm.bias"], config.layer_norm_eps,
                   fused=fused)
    return F.dropout(x, config.hidden_dropout_prob, training)
