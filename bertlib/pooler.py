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
    cls = sequence_output[:, 0]  # (batch, hidden)
    return torch.tanh(F.linear(cls, state_dict["pooler.dense.weight"], state_dict["pooler.dense.bias"]))
