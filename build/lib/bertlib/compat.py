"""Old names, kept so that code written against an earlier bertlib still runs; each call warns
(``DeprecationWarning``) and names what to use instead. Nothing in the book calls them.

- ``relative_bert_forward`` (was ``bertlib.relative_position.relative_bert_forward``): :func:`bertlib.bert_forward`,
  which follows ``config.position_embedding_type``.
- ``pruned_bert_forward`` (was ``bertlib.head_pruning.pruned_bert_forward``): :func:`bertlib.bert_forward`, which
  reads ``config.pruned_heads``.
- ``relative_self_attention`` (was ``bertlib.relative_position.relative_self_attention``):
  :func:`bertlib.self_attention`, which adds the relative terms whenever the config asks for them.
- ``bert_forward_unpadded`` (was ``bertlib.unpadded.bert_forward_unpadded``):
  ``bertlib.bert_forward(..., attn_implementation="unpadded", fused=True)``.

Their old module paths still find them here. Removed outright, since nothing called them:
``head_pruning.prune_heads`` (it dropped the config that :func:`bertlib.head_pruning.prune` returns: use that),
``head_pruning.pruned_self_attention`` and ``relative_position.relative_embeddings`` (use
:func:`bertlib.self_attention` and :func:`bertlib.embeddings`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import torch
from transformers import BertConfig

from .checks import RELATIVE_TYPES, position_embedding_type
from .encoder import BertForwardOutput, bert_forward
from .multi_head import self_attention


def _deprecated(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated and will be removed: use {new}.", DeprecationWarning, stacklevel=3)


def _require_relative(config: BertConfig) -> None:
    kind = position_embedding_type(config)
    if kind not in RELATIVE_TYPES:
        raise ValueError(f"config.position_embedding_type must be one of {RELATIVE_TYPES} for relative attention, "
                         f"got {kind!r}; set it on the config (BertConfig(position_embedding_type='relative_key')).")


def relative_bert_forward(state_dict: Mapping[str, torch.Tensor], config: BertConfig, input_ids: torch.Tensor,
                          attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                          **kwargs) -> BertForwardOutput:
    """Deprecated: :func:`bertlib.bert_forward` (same arguments), which runs relative position attention whenever
    ``config.position_embedding_type`` is ``relative_key`` or ``relative_key_query``. This name insisted on such a
    config, and still does."""
    _deprecated("bertlib.relative_position.relative_bert_forward",
                "bertlib.bert_forward (it follows config.position_embedding_type)")
    _require_relative(config)
    return bert_forward(state_dict, config, input_ids, attention_mask, token_type_ids, **kwargs)


def pruned_bert_forward(state_dict: Mapping[str, torch.Tensor], config: BertConfig, input_ids: torch.Tensor,
                        attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                        **kwargs) -> BertForwardOutput:
    """Deprecated: :func:`bertlib.bert_forward` (same arguments), which reads ``config.pruned_heads`` (the config
    :func:`bertlib.head_pruning.prune` returns)."""
    _deprecated("bertlib.head_pruning.pruned_bert_forward", "bertlib.bert_forward (it reads config.pruned_heads)")
    return bert_forward(state_dict, config, input_ids, attention_mask, token_type_ids, **kwargs)


def relative_self_attention(state_dict: Mapping[str, torch.Tensor], config: BertConfig, hidden_states: torch.Tensor,
                            attention_mask: torch.Tensor | None = None,
                            **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Deprecated: :func:`bertlib.self_attention` (same arguments), which adds the relative terms whenever
    ``config.position_embedding_type`` asks for them. This name insisted on such a config, and still does."""
    _deprecated("bertlib.relative_position.relative_self_attention",
                "bertlib.self_attention (it follows config.position_embedding_type)")
    _require_relative(config)
    return self_attention(state_dict, config, hidden_states, attention_mask, **kwargs)


def bert_forward_unpadded(state_dict: Mapping[str, torch.Tensor], config: BertConfig, input_ids: torch.Tensor,
                          attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                          **kwargs) -> BertForwardOutput:
    """Deprecated: ``bertlib.bert_forward(..., attn_implementation="unpadded", fused=True)`` (same keywords)."""
    _deprecated("bertlib.unpadded.bert_forward_unpadded",
                "bertlib.bert_forward(..., attn_implementation='unpadded', fused=True)")
    kwargs.setdefault("fused", True)
    return bert_forward(state_dict, config, input_ids, attention_mask, token_type_ids, attn_implementation="unpadded",
                        **kwargs)
