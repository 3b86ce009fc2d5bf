"""Word + position + token-type embeddings (chapter 2, *Embeddings*); mirrors HF ``BertEmbeddings``."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from transformers import BertConfig

from bertlib.model.checks import check_config, check_inputs, position_embedding_type
from bertlib.model.layer_norm import layer_norm
from bertlib.model.options import DEFAULT_OPTIONS, ForwardOptions


def embeddings(state_dict: Mapping[str, torch.Tensor], config: BertConfig, input_ids: torch.Tensor,
               token_type_ids: torch.Tensor | None = None, *, position_ids: torch.Tensor | None = None,
               options: ForwardOptions = DEFAULT_OPTIONS) -> torch.Tensor:
    """``LayerNorm(word[input_ids] + token_type[token_type_ids] + position[position_ids])``.

    ``input_ids``, ``token_type_ids``: ``(batch, seq)`` integers (segment ids default to 0); ``position_ids``:
    ``(batch, seq)``, ``(1, seq)`` or ``(seq,)``, default ``0..seq-1`` (HF's argument: e.g. packed sequences that
    restart at 0). Returns ``(batch, seq, hidden)``. With a relative ``config.position_embedding_type`` no absolute
    position vector is added (HF 4.x, chapter 13). Of the ``options`` (:class:`bertlib.model.options.ForwardOptions`)
    it reads ``training`` (dropout, ``hidden_dropout_prob``), ``fused`` (the LayerNorm as one kernel) and ``check``
    (``False`` skips the input checks: :func:`bertlib.bert_forward` has made them once).
    Defined in chapter 2, *Embeddings*; the LayerNorm is chapter 3's.
    """
    if options.check:
        check_config(config)
        check_inputs(config, input_ids, token_type_ids=token_type_ids, position_ids=position_ids)
    p = "embeddings."
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    word = state_dict[p + "word_embeddings.weight"][input_ids]  # (batch, seq, hidden)
    token_type = state_dict[p + "token_type_embeddings.weight"][token_type_ids]  # (batch, seq, hidden)
    x = word + token_type  # HF's order of additions, so float rounding matches too
    if position_embedding_type(config) == "absolute":
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = x + state_dict[p + "position_embeddings.weight"][position_ids]  # (seq, hidden): broadcast over batch
    x = layer_norm(x, state_dict[p + "LayerNorm.weight"], state_dict[p + "LayerNorm.bias"], config.layer_norm_eps,
                   fused=options.fused)
    return F.dropout(x, config.hidden_dropout_prob, options.training)
