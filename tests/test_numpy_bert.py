"""bertlib.variants.numpy_bert (chapter 12): the NumPy float64 forward pass against bertlib (float64) and transformers.

Tolerances: NumPy float64 vs bertlib float64: 1e-10 (only float64 rounding differs; measured about 7e-15 on the
embedded model). NumPy float64 vs HF float32: 2e-5, the book's float32 tolerance, since the difference is HF's
float32 rounding (measured 1.5e-6 on real tokens). Hidden states are compared on real (non-padding) positions, as in
test_fidelity.py.
"""

from __future__ import annotations

import ast
import inspect
import math

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import bertlib
import bertlib.variants.numpy_bert as nb
from helpers import DEVICE, random_inputs, random_model

F64 = bertlib.tolerance(DEVICE, torch.float64)
F32 = bertlib.tolerance(DEVICE, torch.float32)  # the HF side runs on DEVICE


def assert_forward_equal(ours: nb.NumpyBertOutput, ref, mask: torch.Tensor, tol: dict) -> None:
    """Every hidden state (real positions), every attention map (real query rows) and the pooler output."""
    real = mask.bool().cpu().numpy()
    assert len(ours.hidden_states) == len(ref.hidden_states) and len(ours.attentions) == len(ref.attentions)
    for a, b in zip(ours.hidden_states, ref.hidden_states, strict=True):
        assert_close(torch.from_numpy(a[real]), b.detach().cpu().double()[torch.from_numpy(real)], **tol)
    for a, b in zip(ours.attentions, ref.attentions, strict=True):
        assert_close(torch.from_numpy(a.swapaxes(1, 2)[real]),
                     b.detach().cpu().double().transpose(1, 2)[torch.from_numpy(real)], **tol)
    assert_close(torch.from_numpy(ours.pooler_output), ref.pooler_output.detach().cpu().double(), **tol)


@pytest.fixture(scope="module")
def np_sd(pretrained):
    return nb.numpy_state_dict(pretrained.state_dict)


def test_state_dict_conversion(pretrained, np_sd):
    assert set(np_sd) == set(pretrained.state_dict)
    assert all(a.dtype == np.float64 for a in np_sd.values())
    name = "embeddings.word_embeddings.weight"
    assert np_sd[name].shape == tuple(pretrained.state_dict[name].shape)


def test_embedded_model_equals_bertlib_float64(pretrained, np_sd, real_batch):
    sd64 = {k: v.double() for k, v in pretrained.state_dict.items()}
    ref = bertlib.bert_forward(sd64, pretrained.config, **real_batch)
    ours = nb.bert_forward(np_sd, pretrained.config, **real_batch)
    assert_forward_equal(ours, ref, real_batch["attention_mask"], F64)


def test_embedded_model_equals_hf_float32(pretrained, hf_model, np_sd, real_batch):
    with torch.no_grad():
        ref = hf_model(**real_batch, output_hidden_states=True, output_attentions=True)
    ours = nb.bert_forward(np_sd, pretrained.config, **real_batch)
    assert_forward_equal(ours, ref, real_batch["attention_mask"], F32)


CONFIGS = [
    dict(),
    dict(num_attention_heads=1, hidden_size=24, intermediate_size=40),
    dict(num_attention_heads=3, hidden_size=36, hidden_act="relu", num_hidden_layers=3),
    dict(num_attention_heads=6, hidden_size=48, hidden_act="gelu_new", layer_norm_eps=1e-5, type_vocab_size=3),
    dict(num_attention_heads=2, hidden_size=16, intermediate_size=128, num_hidden_layers=1, hidden_act="silu"),
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "base")
def test_random_configs_equal_bertlib_and_hf_float64(overrides):
    sd, config, model = random_model(seed=len(overrides) + 10, dtype=torch.float64, **overrides)
    batch = random_inputs(config, batch=3, seq=17, seed=2)
    ours = nb.bert_forward(nb.numpy_state_dict(sd), config, **batch)
    assert_forward_equal(ours, bertlib.bert_forward(sd, config, **batch), batch["attention_mask"], F64)
    with torch.no_grad():
        ref = model(**batch, output_hidden_states=True, output_attentions=True)
    assert_forward_equal(ours, ref, batch["attention_mask"], F64)


def test_defaults_without_mask_and_segments():
    sd, config, _ = random_model(seed=3, dtype=torch.float64)
    ids = random_inputs(config, batch=2, seq=9, seed=4)["input_ids"]
    ours = nb.bert_forward(nb.numpy_state_dict(sd), config, ids.numpy())
    ref = bertlib.bert_forward(sd, config, ids)
    assert_close(torch.from_numpy(ours.last_hidden_state), ref.last_hidden_state, **F64)


def test_steps_equal_bertlib():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 12))
    w, b = rng.standard_normal(12), rng.standard_normal(12)
    for eps in (1e-12, 1e-5):
        assert_close(torch.from_numpy(nb.layer_norm(x, w, b, eps)),
                     bertlib.layer_norm(torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b), eps), **F64)
    assert_close(torch.from_numpy(nb.transpose_for_scores(x, 4)), bertlib.transpose_for_scores(torch.from_numpy(x), 4),
                 atol=0.0, rtol=0.0)
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    assert_close(torch.from_numpy(nb.extended_attention_mask(mask)),
                 bertlib.extended_attention_mask(torch.from_numpy(mask), torch.float64), atol=0.0, rtol=0.0)


def test_softmax_stable_where_naive_overflows():
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((4, 7)) * 3
    assert_close(torch.from_numpy(nb.softmax(logits)), torch.from_numpy(nb.softmax_naive(logits)), **F64)
    assert_close(torch.from_numpy(nb.softmax(logits)), torch.from_numpy(logits).softmax(-1), **F64)
    big = logits * 1000  # entries far above log(finfo(float64).max) = 709.8
    with np.errstate(over="ignore", invalid="ignore"):
        naive = nb.softmax_naive(big)
    assert np.isnan(naive).any()
    stable = nb.softmax(big)
    assert np.isfinite(stable).all()
    assert_close(torch.from_numpy(stable.sum(-1)), torch.ones(4, dtype=torch.float64), **F64)
    assert_close(torch.from_numpy(stable), torch.from_numpy(big).softmax(-1), **F64)
    assert_close(torch.from_numpy(nb.softmax(logits + 500.0)), torch.from_numpy(nb.softmax(logits)), **F64)
    masked = logits + nb.extended_attention_mask(np.array([[1, 1, 1, 1, 1, 0, 0]]))[0, 0]
    assert (nb.softmax(masked)[:, 5:] == 0).all()


def test_erf_and_gelu_forms():
    x = np.linspace(-8, 8, 4001)
    assert_close(torch.from_numpy(nb.erf(x)), torch.erf(torch.from_numpy(x)), atol=1e-15, rtol=0.0)
    assert nb.erf(np.array([[0.5]])).shape == (1, 1)
    assert abs(nb.erf_approx(x) - nb.erf(x)).max() < 1.5e-7  # Abramowitz & Stegun 7.1.26's stated bound
    t = torch.from_numpy(x)
    assert_close(torch.from_numpy(nb.gelu(x)), torch.nn.functional.gelu(t), **F64)
    assert_close(torch.from_numpy(nb.gelu_tanh(x)), torch.nn.functional.gelu(t, approximate="tanh"), **F64)
    diff = np.abs(nb.gelu(x) - nb.gelu_tanh(x)).max()
    assert 1e-4 < diff < 1e-3  # the approximation is off by at most about 4.7e-4
    for name in ("gelu", "gelu_new", "relu", "silu", "tanh"):
        assert_close(torch.from_numpy(nb.activation(name)(x)), bertlib.activation(name)(t), **F64)
    with pytest.raises(ValueError, match="not supported"):
        nb.activation("mish")


def test_tanh_gelu_changes_the_output(pretrained, np_sd, real_batch):
    exact = nb.bert_forward(np_sd, pretrained.config, **real_batch)
    approx = nb.bert_forward(np_sd, pretrained.config, **real_batch, act=nb.gelu_tanh)
    real = real_batch["attention_mask"].bool().cpu().numpy()
    diff = np.abs(exact.last_hidden_state[real] - approx.last_hidden_state[real]).max()
    assert diff > 2e-5  # larger than the float32 tolerance: the two GELUs are different models


def test_bad_inputs():
    sd, config, _ = random_model(seed=0, dtype=torch.float64)
    np_sd = nb.numpy_state_dict(sd)
    with pytest.raises(ValueError, match="integer"):
        nb.bert_forward(np_sd, config, np.zeros((2, 3)))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        nb.bert_forward(np_sd, config, np.zeros((1, config.max_position_embeddings + 1), dtype=np.int64))
    with pytest.raises(ValueError, match="must match"):
        nb.bert_forward(np_sd, config, np.zeros((1, 3), dtype=np.int64), np.ones((1, 4), dtype=np.int64))


def test_module_imports_only_numpy_and_the_standard_library():
    tree = ast.parse(inspect.getsource(nb))
    imported = {a.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "math", "collections", "dataclasses", "typing", "numpy"}, imported
    assert math.isclose(float(nb.erf(np.array(1.0))), math.erf(1.0))
