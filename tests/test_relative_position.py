"""bertlib.variants.relative_position (chapter 13): relative_key and relative_key_query against a straightforward loop
implementation of HF 4.x's formula, the relative_key term against the relative_key code that transformers 5.x still
ships (Wav2Vec2-BERT), the whole forward pass, head_mask, and bad input. transformers 5.x's BertModel no longer has
position_embedding_type, so it cannot be the reference (checked below)."""

from __future__ import annotations

import copy
import math
import types

import pytest
import torch
from torch.testing import assert_close

import bertlib
from bertlib.model import checks, relative_scores
from bertlib.variants import relative_position as R
from helpers import random_inputs, random_model

F64 = dict(atol=1e-10, rtol=0.0)


def absolute(config):
    """The same config with BERT's default absolute positions (what bertlib.bert_forward accepts)."""
    view = copy.copy(config)
    view.position_embedding_type = "absolute"
    return view


def loop_attention(sd, config, x, mask, layer, kind):
    """One layer's relative self-attention with explicit loops over batch, heads, query l and key r (float64)."""
    p = f"encoder.layer.{layer}.attention.self."
    H = config.num_attention_heads
    d = config.hidden_size // H
    M = config.max_position_embeddings
    table = sd[relative_scores.distance_embedding_key(layer)]
    q = x @ sd[p + "query.weight"].T + sd[p + "query.bias"]
    k = x @ sd[p + "key.weight"].T + sd[p + "key.bias"]
    v = x @ sd[p + "value.weight"].T + sd[p + "value.bias"]
    B, T, _ = x.shape
    context = torch.zeros(B, T, config.hidden_size, dtype=x.dtype)
    probs = torch.zeros(B, H, T, T, dtype=x.dtype)
    for b in range(B):
        for h in range(H):
            cols = slice(h * d, (h + 1) * d)
            for l in range(T):
                scores = []
                for r in range(T):
                    if mask is not None and mask[b, r] == 0:
                        scores.append(-math.inf)
                        continue
                    e = table[l - r + M - 1]  # the row for distance l - r
                    s = sum(q[b, l, cols][i] * k[b, r, cols][i] for i in range(d))
                    s = s + sum(q[b, l, cols][i] * e[i] for i in range(d))
                    if kind == "relative_key_query":
                        s = s + sum(k[b, r, cols][i] * e[i] for i in range(d))
                    scores.append(s / math.sqrt(d))
                top = max(scores)
                ex = [math.exp(s - top) if s != -math.inf else 0.0 for s in scores]
                total = sum(ex)
                for r in range(T):
                    probs[b, h, l, r] = ex[r] / total
                    context[b, l, cols] += probs[b, h, l, r] * v[b, r, cols]
    return context, probs


@pytest.mark.parametrize("kind", checks.RELATIVE_TYPES)
def test_relative_attention_equals_loop(kind):
    sd, config, _ = random_model(seed=0, dtype=torch.float64, max_position_embeddings=12, num_attention_heads=2,
                                 hidden_size=8, intermediate_size=16, position_embedding_type=kind)
    sd = R.add_distance_embeddings(sd, config, seed=1, std=0.5)  # large, so the position terms matter
    batch = random_inputs(config, batch=2, seq=6, seed=2)
    x = torch.randn(2, 6, config.hidden_size, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    mask = bertlib.extended_attention_mask(batch["attention_mask"], torch.float64)
    ours, ours_p = bertlib.self_attention(sd, config, x, mask, layer=1)
    ref, ref_p = loop_attention(sd, config, x, batch["attention_mask"], 1, kind)
    real = batch["attention_mask"].bool()
    assert_close(ours[real], ref[real], **F64)
    rows = real[:, None, :, None]
    assert_close(ours_p[rows.expand_as(ours_p)], ref_p[rows.expand_as(ref_p)], **F64)
    plain, _ = bertlib.self_attention(sd, absolute(config), x, mask, layer=1)  # the position terms change the result
    assert (ours[real] - plain[real]).abs().max() > 1e-3


def test_relative_key_term_equals_wav2vec2_bert():
    """Wav2Vec2-BERT keeps relative_key in transformers 5.x with distance r - l (clamped) where BERT used l - r:
    its table is ours upside down, and its bias is our term times 1/sqrt(d)."""
    from transformers.models.wav2vec2_bert.modeling_wav2vec2_bert import _apply_relative_key_position_encoding

    M, d = 10, 4
    g = torch.Generator().manual_seed(0)
    table = torch.randn(2 * M - 1, d, generator=g, dtype=torch.float64)
    q = torch.randn(2, 3, 7, d, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 7, d, generator=g, dtype=torch.float64)
    module = types.SimpleNamespace(left_max_position_embeddings=M - 1, right_max_position_embeddings=M - 1,
                                   distance_embedding=torch.nn.Embedding.from_pretrained(table.flip(0)),
                                   scaling=d ** -0.5)
    _, bias = _apply_relative_key_position_encoding(module, q, k)
    ours = relative_scores.relative_position_scores(q, k, table, M, "relative_key") / math.sqrt(d)
    assert_close(ours, bias, **F64)


def test_transformers_5_bert_has_no_relative_positions():
    import inspect

    from transformers.models.bert import modeling_bert

    source = inspect.getsource(modeling_bert.BertSelfAttention)
    assert "distance_embedding" not in source and "relative_key" not in source


def test_whole_forward_and_zero_tables():
    """With zero distance tables the position terms vanish: bert_forward on a relative config equals bert_forward
    on the absolute one with the position table set to 0 (relative models add no absolute positions)."""
    sd, config, _ = random_model(seed=4, dtype=torch.float64, position_embedding_type="relative_key_query")
    batch = random_inputs(config, batch=3, seq=10, seed=5)
    real = batch["attention_mask"].bool()
    zero = R.add_distance_embeddings(sd, config, std=0.0)
    positions = "embeddings.position_embeddings.weight"
    no_pos = {**sd, positions: torch.zeros_like(sd[positions])}
    ours = bertlib.bert_forward(zero, config, **batch)
    ref = bertlib.bert_forward(no_pos, absolute(config), **batch)
    assert_close(ours.last_hidden_state[real], ref.last_hidden_state[real], **F64)
    assert_close(ours.pooler_output, ref.pooler_output, **F64)
    # layer by layer: self_attention (relative terms) + the chapter-6 blocks; head_mask behaves as in bert_forward
    full = R.add_distance_embeddings(sd, config, seed=6, std=0.3)
    out = bertlib.bert_forward(full, config, **batch)
    mask = bertlib.extended_attention_mask(batch["attention_mask"], torch.float64)
    x = out.hidden_states[0]
    for layer in range(config.num_hidden_layers):
        ctx, _ = bertlib.self_attention(full, config, x, mask, layer=layer)
        x = bertlib.feed_forward(full, config, bertlib.attention_output(full, config, ctx, x, layer=layer), layer=layer)
        assert_close(x[real], out.hidden_states[layer + 1][real], **F64)
    hm = torch.tensor([1.0, 0.0, 1.0, 0.5], dtype=torch.float64)
    masked = bertlib.bert_forward(full, config, **batch, head_mask=hm)
    assert (masked.attentions[0][:, 1] == 0).all()
    assert (masked.last_hidden_state[real] - out.last_hidden_state[real]).abs().max() > 1e-4


def test_bad_input():
    sd, config, _ = random_model(seed=0)
    batch = random_inputs(config, batch=2, seq=5, seed=1)
    config.position_embedding_type = "relative_key"
    with pytest.raises(ValueError, match="add_distance_embeddings"):
        bertlib.bert_forward(sd, config, **batch)  # a relative config without its distance tables
    q = torch.zeros(1, 1, 5, 12)
    with pytest.raises(ValueError, match="2 \\* max_position_embeddings - 1"):
        relative_scores.relative_position_scores(q, q, torch.zeros(10, 12), 40, "relative_key")
    with pytest.raises(ValueError, match="exceeds max_position_embeddings"):
        relative_scores.relative_position_scores(q, q, torch.zeros(5, 12), 3, "relative_key")
    with pytest.raises(ValueError, match="relative_key"):
        relative_scores.relative_position_scores(q, q, torch.zeros(79, 12), 40, "absolute")
    assert relative_scores.relative_distance(3, 4).tolist() == [[0, -1, -2, -3], [1, 0, -1, -2], [2, 1, 0, -1]]
