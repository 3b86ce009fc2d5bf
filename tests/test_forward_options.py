"""One options object below ``bert_forward`` (:mod:`bertlib.model.options`): every step takes a frozen
``ForwardOptions``; the encoder loop alone decides what to keep; the attention extras are typed and named as in
HF v5 (``cu_seq_lens_q``, ``is_causal``, ``head_mask``)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch.testing import assert_close

import bertlib
from bertlib.model import attention_functions, encoder, layer, multi_head
from bertlib.model.options import DEFAULT_OPTIONS, AttentionKwargs, ForwardOptions
from helpers import random_inputs, random_model

F32 = bertlib.tolerance("cpu", torch.float32)
STEPS = [bertlib.embeddings, bertlib.self_attention, bertlib.attention_output, bertlib.feed_forward,
         bertlib.encoder_layer, bertlib.encoder]


def test_options_are_frozen_and_replace_makes_a_copy():
    opts = ForwardOptions(attn_implementation="sdpa")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.fused = True  # type: ignore[misc]
    fast = opts.replace(fused=True)
    assert (opts.fused, fast.fused, fast.attn_implementation) == (False, True, "sdpa")
    assert DEFAULT_OPTIONS == ForwardOptions() and DEFAULT_OPTIONS.attention_kwargs == {}


@pytest.mark.parametrize("step", STEPS, ids=lambda f: f.__name__)
def test_every_step_below_bert_forward_takes_one_options_object(step):
    """No step repeats bert_forward's keywords: one ``options`` (defaulting to the formulas), at most 8 parameters."""
    params = inspect.signature(step).parameters
    assert params["options"].default is DEFAULT_OPTIONS
    assert not {"training", "fused", "check", "attn_implementation", "output_attentions",
                "output_hidden_states"} & set(params)
    assert len(params) <= 8


def test_attention_functions_share_hf_v5_signature():
    for fn in attention_functions.ATTENTION_FUNCTIONS.values():
        names = list(inspect.signature(fn).parameters)
        assert names == ["query", "key", "value", "attention_mask", "scaling", "dropout", "kwargs"], fn.__name__
    assert set(AttentionKwargs.__annotations__) == {"head_mask", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q",
                                                    "max_length_k", "is_causal"}


def test_the_layer_returns_its_probabilities_and_the_loop_decides():
    sd, config, _ = random_model(3)
    x = torch.randn(2, 7, config.hidden_size)
    out, probs = bertlib.encoder_layer(sd, config, x)
    assert probs.shape == (2, config.num_attention_heads, 7, 7)
    lean = bertlib.encoder(sd, config, x, options=ForwardOptions(output_attentions=False, output_hidden_states=False))
    full = bertlib.encoder(sd, config, x)
    assert lean[1] == () and len(lean[0]) == 1 and len(full[0]) == config.num_hidden_layers + 1
    assert torch.equal(lean[0][-1], full[0][-1])
    assert torch.equal(full[0][1], out)
    # the layer no longer knows the output flags
    assert "output_attentions" not in inspect.signature(layer.encoder_layer).parameters
    assert "output_attentions" not in inspect.signature(multi_head.self_attention).parameters


def test_options_reach_the_attention_function():
    sd, config, _ = random_model(4)
    x = torch.randn(2, 6, config.hidden_size)
    eager, probs = bertlib.self_attention(sd, config, x)
    sdpa, none = bertlib.self_attention(sd, config, x, options=ForwardOptions(attn_implementation="sdpa"))
    assert none is None and probs is not None
    assert_close(sdpa, eager, **F32)
    with pytest.raises(ValueError, match="not one of bertlib's attention functions"):
        bertlib.self_attention(sd, config, x, options=ForwardOptions(attn_implementation="flash"))


def test_training_option_turns_dropout_on():
    sd, config, _ = random_model(5, hidden_dropout_prob=0.5, attention_probs_dropout_prob=0.5)
    x = torch.randn(2, 6, config.hidden_size)
    plain = bertlib.encoder_layer(sd, config, x)[0]
    assert torch.equal(plain, bertlib.encoder_layer(sd, config, x)[0])
    assert not torch.equal(plain, bertlib.encoder_layer(sd, config, x, options=ForwardOptions(training=True))[0])


def test_padding_free_attention_reads_typed_offsets():
    """``cu_seq_lens_q`` (HF v5's name) says where each packed sequence starts; without it, a clear error."""
    sd, config, _ = random_model(6)
    batch = random_inputs(config, 3, 9, seed=6)
    padded = bertlib.bert_forward(sd, config, **batch)
    unpadded = bertlib.bert_forward(sd, config, **batch, attn_implementation="unpadded")
    real = batch["attention_mask"].bool()
    assert_close(unpadded.last_hidden_state[real], padded.last_hidden_state[real], **F32)
    q = torch.randn(1, config.num_attention_heads, 5, 12)
    with pytest.raises(ValueError, match="cu_seq_lens_q"):
        attention_functions.varlen_attention_forward(q, q, q, None, 1.0)
    _, cu, _ = encoder.unpad(torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]))
    ctx, _ = attention_functions.varlen_attention_forward(q, q, q, None, 1.0, cu_seq_lens_q=cu)
    first = torch.nn.functional.scaled_dot_product_attention(q[:, :, :3], q[:, :, :3], q[:, :, :3], scale=1.0)
    assert_close(ctx[:, :3], first.transpose(1, 2), **F32)
