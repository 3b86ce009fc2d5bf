"""Shared fixtures: the embedded model, its HF twin, real padded batches, random configurations."""

from __future__ import annotations

import os
import random
import subprocess

import pytest
import torch
import transformers
from transformers import BertConfig, BertModel

import bertlib

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
os.environ.setdefault("HF_HUB_OFFLINE", "1")

#: Fidelity tests run on bertlib.get_device(): CPU here and in CI, CUDA on a GPU runner (TF32 off).
DEVICE = bertlib.get_device()
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


#: Seconds a test's subprocess (a fine-tuning run, a torchrun group, a notebook) may take before it counts as hung.
#: Generous, since a chapter has taken 19 minutes on a loaded 2-core machine; a hang (a DDP rendezvous that never
#: completes) still fails instead of stalling the suite. Raise it with $BERTLIB_TEST_SUBPROCESS_TIMEOUT.
SUBPROCESS_TIMEOUT = float(os.environ.get("BERTLIB_TEST_SUBPROCESS_TIMEOUT", 3600))


def finish(proc: subprocess.Popen) -> str:
    """Wait for ``proc`` (with ``SUBPROCESS_TIMEOUT``; killed if it runs over), assert it succeeded, return stdout."""
    try:
        stdout, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
        raise AssertionError(f"still running after {SUBPROCESS_TIMEOUT:.0f} s (BERTLIB_TEST_SUBPROCESS_TIMEOUT)\n"
                             f"{stdout}\n{stderr}") from None
    assert proc.returncode == 0, f"exit {proc.returncode}\n{stdout}\n{stderr}"
    return stdout


@pytest.fixture(scope="session")
def pretrained() -> bertlib.Pretrained:
    return bertlib.load_pretrained(device=DEVICE)


@pytest.fixture(scope="session")
def hf_model(pretrained) -> BertModel:
    return bertlib.to_hf_model(pretrained, attn_implementation="eager")


def _data_available() -> bool:
    from pathlib import Path

    from sklearn.datasets import get_data_home

    return bool(os.environ.get("BERTLIB_20NG_ARCHIVE")) or (Path(get_data_home()) / "20news-bydate_py3.pkz").exists()


@pytest.fixture(scope="session")
def real_sentences() -> list[str]:
    """Three real 20 Newsgroups sentences of different lengths (so the batch is padded)."""
    if not _data_available():
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


def random_model(seed: int, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 **overrides) -> tuple[dict, BertConfig, BertModel]:
    """A small random BertModel whose LayerNorm weights and biases are random too (not 1 and 0)."""
    fields = dict(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
                  max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)
    fields.update(overrides)
    config = BertConfig(**fields)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = BertModel(config).to(device=device, dtype=dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "LayerNorm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, config, model


def random_inputs(config: BertConfig, batch: int, seq: int, seed: int,
                  device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Random ids, a right-padded mask with one full-length row, random segment ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=g)
    lengths = [seq] + [random.Random(seed + i).randint(1, seq) for i in range(1, batch)]
    mask = torch.tensor([[1] * n + [0] * (seq - n) for n in lengths])
    types = torch.randint(0, config.type_vocab_size, (batch, seq), generator=g)
    return {k: v.to(device) for k, v in {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}.items()}
