"""Shared fixtures: the embedded model, its HF twin, real padded batches, and a tiny random BERT for the tests of
plumbing (training loops, checkpoints, windows, the commands). Plain helpers live in helpers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import transformers
from transformers import BertConfig, BertModel

import bertlib
import bertlib.data.corpus
import bertlib.model.runtime
from bertlib.training.pretraining import init_state_dict
from helpers import DEVICE, data_available

# Re-exported for test modules that still write `from conftest import DEVICE`: import it from helpers instead.
__all__ = ["DEVICE"]

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if threads := bertlib.model.runtime.num_threads():  # $BERTLIB_NUM_THREADS: make test gives each xdist worker its share
    torch.set_num_threads(threads)
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
    return bertlib.data.corpus.example_sentences(3, seed=0)


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


#: The tiny BERT's shape: 2 layers of hidden size 32 (2 heads of 16), the embedded model's vocabulary and tokenizer.
TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=128)


@pytest.fixture(scope="session")
def tiny_pretrained(pretrained) -> bertlib.Pretrained:
    """A BERT of :data:`TINY_BERT`'s shape with random weights (HF's initialisation, seed 0) and the embedded model's
    tokenizer, on the CPU. What a test of plumbing needs (a run resumes bit for bit, windows pool, files are
    written), at a few percent of all-MiniLM-L6-v2's cost; tests of what training achieves use the real model."""
    config = BertConfig(vocab_size=pretrained.config.vocab_size, pad_token_id=pretrained.config.pad_token_id,
                        **TINY_BERT)
    return bertlib.Pretrained(init_state_dict(config, seed=0, heads=False), config, pretrained.tokenizer,
                              source="tiny random BERT (tests/conftest.py)")


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_pretrained, tmp_path_factory) -> Path:
    """:func:`tiny_pretrained` as a Hugging Face directory (config.json, model.safetensors, tokenizer files): what
    ``--model`` of ``python -m bertlib.training.finetune`` and ``bertlib.load_pretrained`` take."""
    path = tmp_path_factory.mktemp("tiny-bert")
    bertlib.to_hf_model(tiny_pretrained).save_pretrained(path)
    tiny_pretrained.tokenizer.save_pretrained(path)
    return path
