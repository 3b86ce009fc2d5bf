"""Shared fixtures: the embedded model, its HF twin, real padded batches. Plain helpers live in helpers.py."""

from __future__ import annotations

import os

import pytest
import torch
import transformers
from transformers import BertModel

import bertlib
from helpers import DEVICE, data_available

# Re-exported for test modules that still write `from conftest import DEVICE`: import it from helpers instead.
__all__ = ["DEVICE"]

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(scope="session")
def pretrained() -> bertlib.Pretrained:
    return bertlib.load_pretrained(device=DEVICE)


@pytest.fixture(scope="session")
def hf_model(pretrained) -> BertModel:
    return bertlib.to_hf_model(pretrained, attn_implementation="eager")


@pytest.fixture(scope="session")
def real_sentences() -> list[str]:
    """Three real 20 Newsgroups sentences of different lengths (so the batch is padded)."""
    if not data_available():
        pytest.skip("20 Newsgroups offline: set BERTLIB_20NG_ARCHIVE=/path/to/20news-bydate.tar.gz")
    return bertlib.data.example_sentences(3, seed=0)


@pytest.fixture(scope="session")
def real_batch(pretrained, real_sentences) -> dict[str, torch.Tensor]:
    """The tokenized padded batch, with a second segment on the last row so token types 0 and 1 both occur."""
    texts = real_sentences[:2] + [(real_sentences[2], "And a second segment.")]
    first = pretrained.tokenizer(texts[:2], padding="longest", return_tensors="pt")
    pair = pretrained.tokenizer(*texts[2], return_tensors="pt")
    seq = max(first["input_ids"].shape[1], pair["input_ids"].shape[1])
    pad = pretrained.tokenizer.pad_token_id

    def grow(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, seq - t.shape[1]), value=value)

    batch = {k: torch.cat([grow(first[k], pad if k == "input_ids" else 0),
                           grow(pair[k], pad if k == "input_ids" else 0)])
             for k in ("input_ids", "attention_mask", "token_type_ids")}
    assert (batch["attention_mask"] == 0).any() and (batch["token_type_ids"] == 1).any()
    return {k: v.to(DEVICE) for k, v in batch.items()}
