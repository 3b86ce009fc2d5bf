"""The pooler (chapter 8, *Pooler and classifier head*); mirrors HF ``BertPooler``."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from transformers import BertConfig


def pooler(state_dict: Mapping[str, torch.Tensor], config: BertConfig, sequence_output: torch.Tensor) -> torch.Tensor:
    """``tanh(W h_[CLS] + b)``: the last hidden state of the first token, through a dense layer and tanh.

    ``sequence_output``: ``(batch, seq, hidden)`` → ``(batch, hidden)``. Defined in chapter 8, *Pooler and
    classifier head*.
    """
    if "pooler.dense.weight" not in state_dict:
        raise ValueError("this state dict has no pooler weights (pooler.dense.*): checkpoints saved from "
                         "BertForMaskedLM or without a pooler lack them. Load it with bertlib.load_pretrained, which "
                         "initialises a missing pooler as BertModel does, or use add_pooling_layer=False.")
    cls = sequence_output[:, 0]  # (batch, hidden)
    return torch.tanh(F.linear(cls, state_dict["pooler.dense.weight"], state_dict["pooler.dense.bias"]))
