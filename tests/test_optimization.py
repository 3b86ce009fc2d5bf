"""``bertlib.training.optimization``: the one optimiser recipe of fine-tuning (chapter 9) and pre-training (chapter
11), held against Hugging Face's own code: ``Trainer``'s weight-decay rule, ``get_linear_schedule_with_warmup`` and
``TrainingArguments.get_warmup_steps``."""

from __future__ import annotations

import types

import pytest
import torch
from transformers import BertConfig, Trainer, TrainingArguments, get_linear_schedule_with_warmup

import bertlib
import bertlib.tasks.classifier
from bertlib.training import optimization as O
from bertlib.training import pretraining as P

CONFIG = BertConfig(vocab_size=30, hidden_size=8, num_hidden_layers=2, num_attention_heads=2, intermediate_size=16,
                    max_position_embeddings=16, pad_token_id=0)


@pytest.mark.parametrize("kind", ["classifier", "pretraining"])
def test_no_decay_rule_is_the_trainers(kind):
    if kind == "classifier":
        model = bertlib.tasks.classifier.BertClassifier(P.init_state_dict(CONFIG, seed=0, heads=False), CONFIG, 3)
    else:
        model = P.BertPretrainingModel(P.init_state_dict(CONFIG, seed=0), CONFIG)
    hf_decay = set(Trainer.get_decay_parameter_names(None, model))  # the method does not use `self`
    ours = {n for n, _ in model.named_parameters() if O.decays(n)}
    assert ours == hf_decay
    assert "bert.embeddings.word_embeddings.weight" in ours and not any("LayerNorm" in n for n in ours)
    groups = O.param_groups(model, 1e-3, 0.01, head_prefix="classifier.", head_lr=1e-2)
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for g in groups for p in g["params"]) == sorted(names.values()), "each once"
    for g in groups:
        for p in g["params"]:
            assert g["weight_decay"] == (0.01 if names[id(p)] in hf_decay else 0.0)
            assert g["lr"] == (1e-2 if names[id(p)].startswith("classifier.") else 1e-3)


@pytest.mark.parametrize("total, ratio", [(102, 0.1), (1500, 0.1), (10, 0.0), (7, 0.5)])
def test_schedule_is_hugging_faces(total, ratio):
    args = types.SimpleNamespace(warmup_steps=ratio)  # get_warmup_steps reads only this field
    warmup = O.warmup_steps(total, ratio)
    assert warmup == TrainingArguments.get_warmup_steps(args, total)
    model = torch.nn.Linear(2, 2)
    ours = O.schedule(torch.optim.AdamW(model.parameters(), lr=2.0), total, ratio)
    ref = get_linear_schedule_with_warmup(torch.optim.AdamW(model.parameters(), lr=2.0), warmup, total)
    factor = O.linear_schedule(warmup, total)
    for step in range(total + 1):
        assert ours.get_last_lr() == ref.get_last_lr() == [2.0 * factor(step)], step
        ours.optimizer.step()
        ref.optimizer.step()
        ours.step()
        ref.step()
    assert factor(0) == (0.0 if warmup else 1.0) and factor(total) == 0.0
    with pytest.raises(ValueError, match="warmup_ratio"):
        O.warmup_steps(10, 1.5)


def test_optimizer_step_clips_steps_and_zeroes():
    model = torch.nn.Linear(3, 1, bias=False)
    opt = O.adamw(model, lr=0.1, weight_decay=0.0)
    sched = O.schedule(opt, total_steps=4, warmup_ratio=0.0)
    (model(torch.ones(1, 3)) * 100).sum().backward()
    before = model.weight.detach().clone()
    norm = O.optimizer_step(model.parameters(), opt, sched, max_grad_norm=1.0)
    torch.testing.assert_close(norm, torch.tensor(100 * 3**0.5))
    assert model.weight.grad is None and sched.get_last_lr() == [0.1 * 3 / 4]
    torch.testing.assert_close(model.weight.detach(), before - 0.1, atol=1e-6, rtol=0)  # Adam's first step: lr·sign
