"""bertlib.training.small_bert (chapters 11b and 15): chapter 11b's recipe in one place, its data and its model."""

from __future__ import annotations

import numpy as np
import torch

from bertlib.data import pretraining_data
from bertlib.training import small_bert
from bertlib.training.pretraining import PretrainRecipe

DOCS = [[f"the {w} sat on mat number {k} today." for k in range(4)] for w in ("cat", "dog", "bird", "fish", "cow")]


def test_recipe_per_profile():
    assert small_bert.recipe("quick") is small_bert.RECIPES["quick"]
    assert small_bert.recipe("full") is small_bert.recipe("cpu") is small_bert.RECIPES["full"]


def test_prepare_is_the_inline_steps_and_train_runs(pretrained, monkeypatch):
    """prepare() gives what chapter 11b's inline steps give; train() runs the recipe (shortened here)."""
    tok = pretrained.tokenizer
    settings = small_bert.Recipe(n_docs=4, max_length=24, vocab_c=40, hidden=16, steps=3,
                                 training=PretrainRecipe(batch_size=4, lr=1e-3, weight_decay=0.01), held_out=3)
    prepared = small_bert.prepare(DOCS, DOCS[::-1], tok, settings, seed=0)
    pairs = pretraining_data.nsp_pairs(DOCS[:4], np.random.default_rng(0), sentences_per_segment=2)
    full_ids = pretraining_data.tokenize_pairs(pairs, tok, 24)
    cvocab = pretraining_data.compact_vocab(full_ids.input_ids[full_ids.attention_mask.bool()], tok, 40)
    assert torch.equal(prepared.cvocab.new_to_old, cvocab.new_to_old)
    assert torch.equal(prepared.data.input_ids, full_ids.remap(cvocab).input_ids)
    assert len(prepared.held_out) <= 3 and prepared.held_out.vocab_size == cvocab.size
    config = small_bert.config_for(prepared.cvocab, settings)
    assert (config.hidden_size, config.num_hidden_layers, config.max_position_embeddings) == (16, 2, 48)
    monkeypatch.setitem(small_bert.RECIPES, "quick", settings)
    made = small_bert.train(DOCS, DOCS[::-1], tok, profile="quick", seed=0)
    assert len(made.history.mlm) == 3 and made.config.to_dict() == config.to_dict()
