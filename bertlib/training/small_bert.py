"""The small BERT of chapter 11b, pre-trained from scratch on 20 Newsgroups sentence pairs: its recipe, in one place.

Chapter 11b (section 11b.2) builds it step by step and shows that its inline steps give what :func:`prepare` gives;
chapter 15 reuses it through :func:`train` to fill in ``[MASK]``. The settings of each profile are :data:`RECIPES`
(``quick`` for the quick profile, ``full`` for every other).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import BertConfig, PreTrainedTokenizerBase

from bertlib.data.pretraining_data import CompactVocab, PretrainingData, compact_vocab, nsp_pairs, tokenize_pairs
from bertlib.training.pretraining import (
    BertPretrainingModel,
    PretrainRecipe,
    TrainingHistory,
    init_state_dict,
    pretrain,
)

__all__ = ["RECIPES", "Recipe", "SmallBert", "SmallBertData", "config_for", "prepare", "recipe", "train"]


@dataclass(frozen=True)
class Recipe:
    """How chapter 11b's small BERT is made: its data, its size and its training run."""

    n_docs: int | None  #: training posts (``None``: all of them)
    max_length: int  #: tokens per sentence pair
    vocab_c: int  #: size of the compact vocabulary, |V_c|
    hidden: int  #: hidden size H (2 layers, 2 heads, feed-forward 4H)
    steps: int
    training: PretrainRecipe  #: pairs per step, peak rate, warm-up, weight decay, masking rate (:func:`pretrain`)
    held_out: int  #: held-out pairs, from the first 1,000 test posts
    per_segment: int = 2  #: consecutive sentences in segment A, and in segment B


#: Chapter 11b's settings: a few minutes on a CPU (quick), or the longer run of the full profile.
RECIPES: dict[str, Recipe] = {
    "quick": Recipe(n_docs=4000, max_length=64, vocab_c=2000, hidden=64, steps=1000,
                    training=PretrainRecipe(batch_size=64, lr=3e-3, weight_decay=0.01), held_out=1000),
    "full": Recipe(n_docs=None, max_length=96, vocab_c=4000, hidden=128, steps=5000,
                   training=PretrainRecipe(batch_size=64, lr=2e-3, weight_decay=0.01), held_out=2000),
}


def recipe(profile: str) -> Recipe:
    """The recipe of a profile: ``quick``'s for the quick profile, ``full``'s for any other (chapter 11b)."""
    return RECIPES["quick" if profile == "quick" else "full"]


@dataclass
class SmallBertData:
    """The training pairs (``full_ids`` in tokenizer ids, ``data`` in compact ids), the compact vocabulary and the
    held-out pairs (compact ids) of chapter 11b."""

    full_ids: PretrainingData
    cvocab: CompactVocab
    data: PretrainingData
    held_out: PretrainingData


def prepare(docs: Sequence[Sequence[str]], test_docs: Sequence[Sequence[str]], tokenizer: PreTrainedTokenizerBase,
            settings: Recipe, seed: int) -> SmallBertData:
    """Chapter 11b's data: NSP pairs of ``settings.n_docs`` training posts (``docs``: each a list of sentences),
    tokenized to ``max_length``; the compact vocabulary of their ``vocab_c`` most frequent pieces; held-out pairs from
    the first 1,000 test posts (a generator seeded ``seed + 1``). Defined in chapter 11b, section 11b.2."""
    n_docs = settings.n_docs or len(docs)
    pairs = nsp_pairs(docs[:n_docs], np.random.default_rng(seed), sentences_per_segment=settings.per_segment)
    full_ids = tokenize_pairs(pairs, tokenizer, settings.max_length)
    cvocab = compact_vocab(full_ids.input_ids[full_ids.attention_mask.bool()], tokenizer, settings.vocab_c)
    held_pairs = nsp_pairs(test_docs[:1000], np.random.default_rng(seed + 1),
                           sentences_per_segment=settings.per_segment)
    held_out = tokenize_pairs(held_pairs, tokenizer, settings.max_length).remap(cvocab)
    held_out = held_out.subset(slice(0, settings.held_out))
    return SmallBertData(full_ids, cvocab, full_ids.remap(cvocab), held_out)


def config_for(cvocab: CompactVocab, settings: Recipe) -> BertConfig:
    """The small model's configuration: 2 layers, 2 heads, width ``hidden``, no dropout, and a position table of
    ``2 * max_length`` rows (chapter 11b, section 11b.2.3, looks at the half that training never reads)."""
    return BertConfig(vocab_size=cvocab.size, hidden_size=settings.hidden, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=4 * settings.hidden, max_position_embeddings=2 * settings.max_length,
                      pad_token_id=cvocab.pad_id, hidden_act="gelu", hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0)


@dataclass
class SmallBert:
    """A trained small BERT with what it was trained on: its model, configuration, data and training history."""

    model: BertPretrainingModel
    config: BertConfig
    prepared: SmallBertData
    history: TrainingHistory


def train(docs: Sequence[Sequence[str]], test_docs: Sequence[Sequence[str]], tokenizer: PreTrainedTokenizerBase, *,
          profile: str, seed: int, device: torch.device | str = "cpu",
          log: Callable[[str], None] | None = None) -> SmallBert:
    """Chapter 11b's small BERT, made again: :func:`prepare`, :func:`config_for`, the initialisation of
    :func:`~bertlib.training.pretraining.init_state_dict` from ``seed``, then
    :func:`~bertlib.training.pretraining.pretrain` with the profile's :func:`recipe`. Defined in chapter 11b."""
    settings = recipe(profile)
    prepared = prepare(docs, test_docs, tokenizer, settings, seed)
    config = config_for(prepared.cvocab, settings)
    model = BertPretrainingModel(init_state_dict(config, seed=seed), config).to(device)
    history = pretrain(model, prepared.data, steps=settings.steps, recipe=settings.training, seed=seed, log=log,
                       log_every=max(settings.steps // 8, 1))
    return SmallBert(model, config, prepared, history)
