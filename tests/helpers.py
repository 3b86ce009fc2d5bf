"""What the test modules share besides fixtures: ``from helpers import DEVICE, random_model, ...``.

pyproject.toml's ``[tool.pytest.ini_options] pythonpath`` puts ``tests/`` (and the repository root and ``_ext/``) on
``sys.path``, so no test edits it. Fixtures stay in ``conftest.py``, which pytest loads itself; a test module never
imports ``conftest``.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from transformers import BertConfig, BertModel

import bertlib
from toc import ROOT

__all__ = ["DEVICE", "ROOT", "SUBPROCESS_TIMEOUT", "data_available", "finish", "needs_data", "one_thread",
           "random_inputs", "random_model", "tar_gz"]

#: Fidelity tests run on bertlib.get_device(): CPU here and in CI, CUDA on a GPU runner (TF32 off, conftest.py).
DEVICE = bertlib.get_device()

#: Seconds a test's subprocess (a torchrun group, a notebook) may take before it counts as hung. Generous, since a
#: chapter has taken 19 minutes on a loaded 2-core machine; a hang (a DDP rendezvous that never completes) still
#: fails instead of stalling the suite. Raise it with $BERTLIB_TEST_SUBPROCESS_TIMEOUT.
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


def data_available() -> bool:
    """Whether 20 Newsgroups can be loaded offline: ``$BERTLIB_20NG_ARCHIVE`` or scikit-learn's cache."""
    from sklearn.datasets import get_data_home

    return bool(os.environ.get("BERTLIB_20NG_ARCHIVE")) or (Path(get_data_home()) / "20news-bydate_py3.pkz").exists()


def tar_gz(path: Path, members: dict[str, bytes]) -> Path:
    """A ``.tar.gz`` archive at ``path`` holding each ``members`` name with its bytes (a small stand-in for the 20
    Newsgroups archive, or a bad one); returns ``path``."""
    with tarfile.open(path, "w:gz") as tar:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return path


#: Marks a test that reads 20 Newsgroups: skipped, saying how to get the data, when it is not there.
needs_data = pytest.mark.skipif(not data_available(),
                                reason="20 Newsgroups offline: set BERTLIB_20NG_ARCHIVE=/path/to/20news-bydate.tar.gz")


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one CPU thread inside the block: a fixed reduction order, so two runs compare bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


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
