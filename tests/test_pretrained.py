"""load_pretrained: the embedded default, BERTLIB_MODEL, local directories and prefixed checkpoints;
BertClassifier: HF-compatible names, dropout only in training."""

from __future__ import annotations

import torch
from torch.testing import assert_close
from transformers import BertForSequenceClassification

import bertlib
import bertlib.tasks.classifier
from helpers import random_inputs, random_model


def test_embedded_default(pretrained):
    c = pretrained.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.vocab_size) == (6, 384, 12, 30522)
    assert set(pretrained.state_dict) == set(bertlib.expected_shapes(c))
    assert len(pretrained.state_dict) == 5 + 16 * c.num_hidden_layers + 2
    assert pretrained.tokenizer("Hello world")["input_ids"] == [101, 7592, 2088, 102]  # uncased WordPiece
    assert all(v.dtype == torch.float32 for v in pretrained.state_dict.values())


def test_env_var_overrides_default(tmp_path, monkeypatch, pretrained):
    sd, config, model = random_model(seed=3, vocab_size=pretrained.config.vocab_size)
    model.save_pretrained(tmp_path)
    pretrained.tokenizer.save_pretrained(tmp_path)
    monkeypatch.setenv("BERTLIB_MODEL", str(tmp_path))
    loaded = bertlib.load_pretrained()
    assert loaded.source == str(tmp_path) and loaded.config.hidden_size == 48
    for k, v in sd.items():
        assert_close(loaded.state_dict[k], v, atol=0, rtol=0)


def test_prefixed_checkpoint_is_normalised(tmp_path, pretrained):
    _, config, _ = random_model(seed=4, vocab_size=pretrained.config.vocab_size)
    torch.manual_seed(0)
    clf = BertForSequenceClassification(config).eval()
    clf.save_pretrained(tmp_path)
    pretrained.tokenizer.save_pretrained(tmp_path)
    loaded = bertlib.load_pretrained(tmp_path, dtype=torch.float64)
    assert set(loaded.state_dict) == set(bertlib.expected_shapes(config))  # bert. stripped, classifier dropped
    assert loaded.state_dict["pooler.dense.weight"].dtype == torch.float64
    assert_close(loaded.state_dict["encoder.layer.0.output.dense.weight"],
                 clf.bert.encoder.layer[0].output.dense.weight.double())


def test_classifier_matches_hf_sequence_classification():
    sd, config, _ = random_model(seed=5)
    clf = bertlib.tasks.classifier.BertClassifier(sd, config, num_labels=3, seed=1).eval()
    ref = BertForSequenceClassification(config.__class__(**{**config.to_dict(), "num_labels": 3})).eval()
    ref.load_state_dict(clf.state_dict(), strict=True)  # same parameter names: bert.*, classifier.*
    batch = random_inputs(config, batch=3, seq=9, seed=2)
    with torch.no_grad():
        assert_close(clf(**batch), ref(**batch).logits, **bertlib.tolerance("cpu", torch.float32))


def test_classifier_dropout_only_in_training():
    sd, config, _ = random_model(seed=6)
    clf = bertlib.tasks.classifier.BertClassifier(sd, config, num_labels=4)
    batch = random_inputs(config, batch=2, seq=8, seed=3)
    clf.eval()
    assert torch.equal(clf(**batch), clf(**batch))
    clf.train()
    torch.manual_seed(0)
    a = clf(**batch)
    b = clf(**batch)
    assert not torch.allclose(a, b)
    a.sum().backward()
    grads = {n: p.grad for n, p in clf.named_parameters()}
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values()), [n for n, g in grads.items() if g is None]
