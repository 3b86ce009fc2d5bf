"""Bad input fails early with an error that names the problem and the fix."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig

import bertlib
from conftest import random_inputs, random_model


@pytest.fixture(scope="module")
def tiny():
    sd, config, _ = random_model(seed=0)
    return sd, config, random_inputs(config, batch=2, seq=7, seed=0)


def forward(tiny, **changes):
    sd, config, batch = tiny
    args = {**batch, **changes}
    return bertlib.bert_forward(changes.pop("state_dict", sd), changes.pop("config", config),
                                args["input_ids"], args["attention_mask"], args["token_type_ids"])


@pytest.mark.parametrize("bad,error,words", [
    (lambda b, c: b["input_ids"].clone().fill_(c.vocab_size), ValueError, ["outside the vocabulary", "tokenizer"]),
    (lambda b, c: b["input_ids"] - 100, ValueError, ["outside the vocabulary"]),
    (lambda b, c: b["input_ids"].float(), TypeError, ["integer token ids", ".long()"]),
    (lambda b, c: b["input_ids"][0], ValueError, ["(batch, seq)", "unsqueeze(0)"]),
    (lambda b, c: b["input_ids"].tolist(), TypeError, ["torch.Tensor"]),
    (lambda b, c: torch.zeros(1, c.max_position_embeddings + 1, dtype=torch.long), ValueError,
     ["max_position_embeddings", "truncation=True"]),
])
def test_bad_input_ids(tiny, bad, error, words):
    sd, config, batch = tiny
    ids = bad(batch, config)
    with pytest.raises(error) as info:
        bertlib.bert_forward(sd, config, ids)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_mask_shape_mismatch(tiny):
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 6\).*must match"):
        forward(tiny, attention_mask=torch.ones(2, 6, dtype=torch.long))


def test_mask_values(tiny):
    with pytest.raises(ValueError, match="only 0 .padding. and 1"):
        forward(tiny, attention_mask=torch.full((2, 7), 2))


def test_token_type_shape_mismatch(tiny):
    with pytest.raises(ValueError, match=r"token_type_ids has shape \(1, 7\)"):
        forward(tiny, token_type_ids=torch.zeros(1, 7, dtype=torch.long))


def test_token_type_out_of_range(tiny):
    with pytest.raises(ValueError, match="type_vocab_size"):
        forward(tiny, token_type_ids=torch.full((2, 7), 2))


def test_heads_do_not_divide_hidden(tiny):
    sd, config, batch = tiny
    bad = BertConfig(**{**config.to_dict(), "num_attention_heads": 5})
    with pytest.raises(ValueError, match="not divisible by num_attention_heads=5.*Choose a head count"):
        bertlib.bert_forward(sd, bad, batch["input_ids"])


def test_missing_keys_are_listed(tiny):
    sd, config, batch = tiny
    partial = {k: v for k, v in sd.items() if "layer.1." not in k and not k.startswith("pooler")}
    with pytest.raises(ValueError) as info:
        bertlib.bert_forward(partial, config, batch["input_ids"])
    msg = str(info.value)
    assert "missing 18 parameter(s)" in msg and "pooler.dense.weight" in msg
    assert "encoder.layer.1.output.dense.bias" in msg


def test_prefixed_keys_get_a_hint(tiny):
    sd, config, batch = tiny
    with pytest.raises(ValueError, match="start with 'bert.'.*load_pretrained"):
        bertlib.bert_forward({"bert." + k: v for k, v in sd.items()}, config, batch["input_ids"])


def test_wrong_weight_shape(tiny):
    sd, config, batch = tiny
    bad = dict(sd, **{"pooler.dense.bias": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"pooler.dense.bias: \(3,\) \(config implies \(48,\)\)"):
        bertlib.bert_forward(bad, config, batch["input_ids"])


def test_not_a_config(tiny):
    sd, config, batch = tiny
    with pytest.raises(TypeError, match="transformers.BertConfig"):
        bertlib.bert_forward(sd, config.to_dict(), batch["input_ids"])


def test_relative_positions_rejected(tiny):
    sd, config, batch = tiny
    rel = BertConfig(**{**config.to_dict(), "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="position_embedding_type='relative_key'"):
        bertlib.bert_forward(sd, rel, batch["input_ids"])


def test_step_functions_check_hidden_shape(tiny):
    sd, config, _ = tiny
    with pytest.raises(ValueError, match=r"shape \(batch, seq, 48\)"):
        bertlib.self_attention(sd, config, torch.zeros(5, 48))
    with pytest.raises(ValueError, match=r"head must be in \[0, 4\)"):
        bertlib.attention_head(sd, config, torch.zeros(1, 5, 48), head=4)


def test_unknown_activation():
    with pytest.raises(ValueError, match="hidden_act='mish' is not supported"):
        bertlib.activation("mish")


def test_unknown_attention_implementation(tiny):
    sd, config, batch = tiny
    with pytest.raises(ValueError, match="'eager' or 'sdpa'"):
        bertlib.bert_forward(sd, config, batch["input_ids"], attn_implementation="flash")


def test_bad_profile(monkeypatch):
    monkeypatch.setenv("BERTLIB_PROFILE", "fast")
    with pytest.raises(ValueError, match="BERTLIB_PROFILE must be one of"):
        bertlib.get_profile()


def test_bad_model_path(tmp_path):
    with pytest.raises(ValueError, match="not a model directory"):
        bertlib.load_pretrained(tmp_path / "nowhere")
