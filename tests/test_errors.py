"""Bad input fails early with an error that names the problem and the fix."""

from __future__ import annotations

import pytest
import torch
from transformers import BertConfig

import bertlib
from helpers import random_inputs, random_model


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
    """A missing layer is one short item; single keys are named; the pooler is optional (HF's add_pooling_layer)
    unless asked for."""
    sd, config, batch = tiny
    partial = {k: v for k, v in sd.items() if "layer.1." not in k and not k.startswith("pooler")}
    with pytest.raises(ValueError) as info:
        bertlib.bert_forward(partial, config, batch["input_ids"])
    msg = str(info.value)
    assert "missing 16 parameter(s)" in msg and "all of encoder.layer.1.* (16 keys)" in msg and len(msg) < 300
    one = {k: v for k, v in sd.items() if k != "encoder.layer.0.output.dense.bias"}
    with pytest.raises(ValueError, match=r"missing 1 parameter\(s\) of BertModel: encoder.layer.0.output.dense.bias\."):
        bertlib.bert_forward(one, config, batch["input_ids"])
    no_pooler = {k: v for k, v in sd.items() if not k.startswith("pooler")}
    assert bertlib.bert_forward(no_pooler, config, batch["input_ids"]).pooler_output is None
    with pytest.raises(ValueError, match="pooler.dense.weight, pooler.dense.bias"):
        bertlib.bert_forward(no_pooler, config, batch["input_ids"], add_pooling_layer=True)


def test_prefixed_keys_get_a_hint(tiny):
    """A BertFor... state dict: one short error (not every key) that names the helper, and the few keys that
    would still be missing after it."""
    sd, config, batch = tiny
    prefixed = {"bert." + k: v for k, v in sd.items()}
    with pytest.raises(ValueError, match="start with 'bert.'.*split_bert_state_dict") as info:
        bertlib.bert_forward(prefixed, config, batch["input_ids"])
    assert len(str(info.value)) < 300
    del prefixed["bert.encoder.layer.1.output.dense.weight"]
    with pytest.raises(ValueError, match="Even then it lacks encoder.layer.1.output.dense.weight."):
        bertlib.bert_forward(prefixed, config, batch["input_ids"])


def test_wrong_weight_shape(tiny):
    sd, config, batch = tiny
    bad = dict(sd, **{"pooler.dense.bias": torch.zeros(3)})
    with pytest.raises(ValueError, match=r"pooler.dense.bias: \(3,\) \(config implies \(48,\)\)"):
        bertlib.bert_forward(bad, config, batch["input_ids"])


def test_not_a_config(tiny):
    sd, config, batch = tiny
    with pytest.raises(TypeError, match="transformers.BertConfig"):
        bertlib.bert_forward(sd, config.to_dict(), batch["input_ids"])


def test_position_embedding_type_checked(tiny):
    """Relative positions run (chapter 13) once the distance tables are there; an unknown type is refused."""
    sd, config, batch = tiny
    rel = BertConfig(**{**config.to_dict(), "position_embedding_type": "relative_key"})
    with pytest.raises(ValueError, match="distance_embedding.*add_distance_embeddings"):
        bertlib.bert_forward(sd, rel, batch["input_ids"])
    bad = BertConfig(**{**config.to_dict(), "position_embedding_type": "rotary"})
    with pytest.raises(ValueError, match="position_embedding_type='rotary' is not supported"):
        bertlib.bert_forward(sd, bad, batch["input_ids"])


def test_cross_attention_refused(tiny):
    sd, config, batch = tiny
    dec = BertConfig(**{**config.to_dict(), "is_decoder": True, "add_cross_attention": True})
    with pytest.raises(ValueError, match="add_cross_attention=True.*not implemented"):
        bertlib.bert_forward(sd, dec, batch["input_ids"])


def test_bad_position_ids(tiny):
    sd, config, batch = tiny
    with pytest.raises(ValueError, match=r"position_ids must lie in \[0, 40\)"):
        forward_with_positions = torch.full_like(batch["input_ids"], 40)
        bertlib.bert_forward(sd, config, batch["input_ids"], position_ids=forward_with_positions)
    with pytest.raises(ValueError, match="position_ids has shape"):
        bertlib.bert_forward(sd, config, batch["input_ids"], position_ids=torch.arange(3))


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
