"""bertlib against transformers.BertModel (eager attention): the whole forward pass and every step.

Why padding positions are excluded: a padded token's *query* row still attends to the real tokens, so its hidden
state is computed, but no real token ever reads it (padding *keys* get probability 0 through the mask) and the
pooler reads only position 0. Those rows carry no meaning, and their values amplify rounding differences between
kernels (measured up to 2e-4 in float32 after 6 layers, against 4e-6 on real tokens). We therefore compare hidden
states on positions where ``attention_mask == 1``; attention probabilities are compared on real query rows over
all key columns (the masked columns must be exactly 0 in both).
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.testing import assert_close

import bertlib
from helpers import DEVICE, random_inputs, random_model

# The one source of the tolerances and of their reasons: bertlib.model.runtime.TOLERANCES (CUDA runs with TF32 off).
F32 = bertlib.tolerance(DEVICE, torch.float32)
F64 = bertlib.tolerance(DEVICE, torch.float64)


def real(t: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The rows of a ``(batch, seq, ...)`` tensor at real (non-padding) positions."""
    return t[mask.bool()]


def hf_run(model, batch):
    with torch.no_grad():
        return model(**batch, output_hidden_states=True, output_attentions=True)


def assert_forward_equal(ours, ref, mask, tol):
    assert len(ours.hidden_states) == len(ref.hidden_states)
    assert len(ours.attentions) == len(ref.attentions)
    for a, b in zip(ours.hidden_states, ref.hidden_states, strict=True):
        assert_close(real(a, mask), real(b, mask), **tol)
    for a, b in zip(ours.attentions, ref.attentions, strict=True):
        rows = mask.bool()[:, None, :].expand(-1, a.shape[1], -1)  # (batch, heads, seq) real query rows
        assert_close(a[rows], b[rows], **tol)
    assert_close(real(ours.last_hidden_state, mask), real(ref.last_hidden_state, mask), **tol)
    assert_close(ours.pooler_output, ref.pooler_output, **tol)


def test_embedded_model_forward_float32(pretrained, hf_model, real_batch):
    ours = bertlib.bert_forward(pretrained.state_dict, pretrained.config, **real_batch)
    ref = hf_run(hf_model, real_batch)
    assert_forward_equal(ours, ref, real_batch["attention_mask"], F32)
    seq = real_batch["input_ids"].shape[1]
    assert ours.attentions[0].shape == (3, pretrained.config.num_attention_heads, seq, seq)


def test_embedded_model_forward_float64(pretrained, hf_model, real_batch):
    sd = {k: v.double() for k, v in pretrained.state_dict.items()}
    ours = bertlib.bert_forward(sd, pretrained.config, **real_batch)
    ref = hf_run(copy.deepcopy(hf_model).double(), real_batch)  # a copy: the session's model stays float32
    assert_forward_equal(ours, ref, real_batch["attention_mask"], F64)


def test_masked_keys_get_zero_probability(pretrained, real_batch):
    ours = bertlib.bert_forward(pretrained.state_dict, pretrained.config, **real_batch)
    pad_keys = (real_batch["attention_mask"] == 0)[:, None, None, :]
    for probs in ours.attentions:
        assert probs.masked_select(pad_keys).abs().max() == 0
        assert_close(probs.sum(-1), torch.ones_like(probs.sum(-1)))


def test_sdpa_path_equals_eager(pretrained, real_batch):
    eager = bertlib.bert_forward(pretrained.state_dict, pretrained.config, **real_batch)
    fast = bertlib.bert_forward(pretrained.state_dict, pretrained.config, **real_batch, attn_implementation="sdpa")
    mask = real_batch["attention_mask"]
    assert_close(real(fast.last_hidden_state, mask), real(eager.last_hidden_state, mask), **F32)
    assert all(a is None for a in fast.attentions)


CONFIGS = [
    dict(),  # 4 heads of 12, gelu
    dict(num_attention_heads=1, hidden_size=24, intermediate_size=40),
    dict(num_attention_heads=3, hidden_size=36, hidden_act="relu", num_hidden_layers=3),
    dict(num_attention_heads=6, hidden_size=48, hidden_act="gelu_new", layer_norm_eps=1e-5, type_vocab_size=3),
    dict(num_attention_heads=2, hidden_size=16, intermediate_size=128, num_hidden_layers=1, hidden_act="silu"),
]


@pytest.mark.parametrize("dtype,tol", [(torch.float32, F32), (torch.float64, F64)], ids=["float32", "float64"])
@pytest.mark.parametrize("overrides", CONFIGS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "base")
def test_random_configs(overrides, dtype, tol):
    sd, config, model = random_model(seed=len(overrides), dtype=dtype, device=DEVICE, **overrides)
    batch = random_inputs(config, batch=3, seq=17, seed=1, device=DEVICE)
    ours = bertlib.bert_forward(sd, config, **batch)
    assert_forward_equal(ours, hf_run(model, batch), batch["attention_mask"], tol)


def test_defaults_without_mask_and_segments(pretrained, hf_model, real_sentences):
    ids = pretrained.tokenizer(real_sentences[0], return_tensors="pt")["input_ids"].to(DEVICE)
    ours = bertlib.bert_forward(pretrained.state_dict, pretrained.config, ids)
    with torch.no_grad():
        ref = hf_model(ids)
    assert_close(ours.last_hidden_state, ref.last_hidden_state, **F32)
    assert_close(ours.pooler_output, ref.pooler_output, **F32)


class CountingDict(dict):
    """A state dict that counts how often each key is read."""

    def __init__(self, *args):
        super().__init__(*args)
        self.reads: dict[str, int] = {}

    def __getitem__(self, key):
        self.reads[key] = self.reads.get(key, 0) + 1
        return super().__getitem__(key)


def test_every_parameter_used_exactly_once(pretrained, real_batch):
    sd = CountingDict(pretrained.state_dict)
    bertlib.bert_forward(sd, pretrained.config, **real_batch)
    assert set(sd.reads) == set(pretrained.state_dict) == set(bertlib.expected_shapes(pretrained.config))
    assert set(sd.reads.values()) == {1}, {k: n for k, n in sd.reads.items() if n != 1}


# ---- every step against its HF submodule ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def steps(pretrained, hf_model, real_batch):
    """Inputs for step tests: embeddings output and the additive mask, computed by HF."""
    with torch.no_grad():
        x = hf_model.embeddings(input_ids=real_batch["input_ids"], token_type_ids=real_batch["token_type_ids"])
    mask = bertlib.extended_attention_mask(real_batch["attention_mask"])
    return x, mask, real_batch["attention_mask"]


def test_embeddings_step(pretrained, steps, real_batch):
    x, _, am = steps
    ours = bertlib.embeddings(pretrained.state_dict, pretrained.config, real_batch["input_ids"],
                              real_batch["token_type_ids"])
    assert_close(ours, x, **F32)


def test_layer_norm_step():
    x = torch.randn(2, 5, 48, dtype=torch.float64, device=DEVICE)
    w, b = torch.randn(48, dtype=torch.float64, device=DEVICE), torch.randn(48, dtype=torch.float64, device=DEVICE)
    for eps in (1e-12, 1e-5):
        assert_close(bertlib.layer_norm(x, w, b, eps), torch.nn.functional.layer_norm(x, (48,), w, b, eps), **F64)


def test_extended_attention_mask():
    m = bertlib.extended_attention_mask(torch.tensor([[1, 1, 0]]), torch.float32)
    assert m.shape == (1, 1, 1, 3)
    assert m[0, 0, 0, :2].eq(0).all() and m[0, 0, 0, 2] == torch.finfo(torch.float32).min


@pytest.mark.parametrize("layer", [0, -1])
def test_attention_steps(pretrained, hf_model, steps, layer):
    config, sd = pretrained.config, pretrained.state_dict
    layer = layer % config.num_hidden_layers
    x, mask, am = steps
    hf_layer = hf_model.encoder.layer[layer]
    with torch.no_grad():
        ref_ctx, ref_probs = hf_layer.attention.self(x, attention_mask=mask)
        ref_attn = hf_layer.attention.output(ref_ctx, x)
        ref_ffn = hf_layer.output(hf_layer.intermediate(ref_attn), ref_attn)
        ref_layer = hf_layer(x, attention_mask=mask)
    ctx, probs = bertlib.self_attention(sd, config, x, mask, layer=layer)
    assert_close(real(ctx, am), real(ref_ctx, am), **F32)
    assert_close(probs, ref_probs, **F32)
    d = config.hidden_size // config.num_attention_heads
    for head in (0, config.num_attention_heads - 1):
        h_ctx, h_probs = bertlib.attention_head(sd, config, x, head, mask, layer=layer)
        assert_close(real(h_ctx, am), real(ref_ctx[..., head * d:(head + 1) * d], am), **F32)
        assert_close(h_probs, ref_probs[:, head], **F32)
    attn = bertlib.attention_output(sd, config, ref_ctx, x, layer=layer)
    assert_close(real(attn, am), real(ref_attn, am), **F32)
    assert_close(real(bertlib.feed_forward(sd, config, ref_attn, layer=layer), am), real(ref_ffn, am), **F32)
    out, _ = bertlib.encoder_layer(sd, config, x, mask, layer=layer)
    assert_close(real(out, am), real(ref_layer, am), **F32)


def test_transpose_for_scores_round_trip():
    x = torch.arange(2 * 3 * 12, dtype=torch.float32).view(2, 3, 12)
    y = bertlib.transpose_for_scores(x, 4)
    assert y.shape == (2, 4, 3, 3)
    assert_close(y[1, 2, 0], x[1, 0, 6:9])


def test_encoder_and_pooler_steps(pretrained, hf_model, steps):
    config, sd = pretrained.config, pretrained.state_dict
    x, mask, am = steps
    with torch.no_grad():
        ref = hf_model.encoder(x, attention_mask=mask).last_hidden_state
        ref_pool = hf_model.pooler(ref)
    hidden, attn = bertlib.encoder(sd, config, x, mask)
    assert len(hidden) == config.num_hidden_layers + 1 and len(attn) == config.num_hidden_layers
    assert_close(real(hidden[-1], am), real(ref, am), **F32)
    assert_close(bertlib.pooler(sd, config, ref), ref_pool, **F32)


@pytest.mark.parametrize("name", ["gelu", "gelu_new", "relu", "silu"])
def test_activations_match_hf(name):
    from transformers.activations import ACT2FN

    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    assert_close(bertlib.activation(name)(x), ACT2FN[name](x), **F64)


def test_fidelity_report_command(real_sentences, capsys):
    """``bertlib-fidelity``: a row per hidden state and per layer's attention, every number within the
    asserted tolerance, for each attention function asked for."""
    from bertlib.evaluation import fidelity

    table = fidelity.main(["--dtypes", "float64", "--attn", "eager,unpadded", "--sentences", "3"])
    out = capsys.readouterr().out
    layers = bertlib.load_pretrained().config.num_hidden_layers
    assert f"| hidden_states[{layers}] |" in out and f"| attentions[{layers - 1}] |" in out
    assert "asserted tolerance" in out
    for column in table.values():
        assert all(v is None or v <= F64["atol"] for v in column.values()), column
    assert table["float64/unpadded"]["attentions[0]"] is None
