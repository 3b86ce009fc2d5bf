"""head_mask in bertlib.bert_forward and bertlib.variants.head_pruning (chapter 13): masking by value-row scaling,
eager vs
sdpa, pruning == masking (random float64 model and the embedded checkpoint), pruned weights in a transformers 5.x
BertModel with smaller Linear layers, parameter counts, the importance gradient against finite differences."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.testing import assert_close

import bertlib
from bertlib.variants import head_pruning as HP
from helpers import random_inputs, random_model

F64 = bertlib.tolerance("cpu", torch.float64)  # these models run on the CPU
F32 = bertlib.tolerance("cpu", torch.float32)


def scaled_values(sd: dict, config, factors: torch.Tensor) -> dict:
    """Independent twin of a head mask: scale head h's rows of the value weight and bias by factors[layer, h].
    (softmax(...) V_h * m = softmax(...) (m V_h): a head mask is a scaling of that head's values.)"""
    out = dict(sd)
    d = config.hidden_size // config.num_attention_heads
    for layer in range(config.num_hidden_layers):
        scale = factors[layer].repeat_interleave(d).to(sd["embeddings.word_embeddings.weight"].dtype)
        p = f"encoder.layer.{layer}.attention.self.value."
        out[p + "weight"] = sd[p + "weight"] * scale[:, None]
        out[p + "bias"] = sd[p + "bias"] * scale
    return out


def test_head_mask_default_ones_and_value_scaling():
    sd, config, _ = random_model(seed=0, dtype=torch.float64)
    batch = random_inputs(config, batch=3, seq=9, seed=1)
    real = batch["attention_mask"].bool()
    plain = bertlib.bert_forward(sd, config, **batch)
    ones = bertlib.bert_forward(sd, config, **batch,
                                head_mask=torch.ones(config.num_attention_heads, dtype=torch.float64))
    assert_close(ones.last_hidden_state, plain.last_hidden_state, atol=0.0, rtol=0.0)
    factors = torch.tensor([[1.0, 0.0, 0.5, 1.0], [0.0, 1.0, 1.0, 2.0]], dtype=torch.float64)
    masked = bertlib.bert_forward(sd, config, **batch, head_mask=factors)
    twin = bertlib.bert_forward(scaled_values(sd, config, factors), config, **batch)
    assert_close(masked.last_hidden_state[real], twin.last_hidden_state[real], **F64)
    assert not torch.allclose(masked.last_hidden_state[real], plain.last_hidden_state[real], atol=1e-3)
    assert (masked.attentions[0][:, 1] == 0).all() and (masked.attentions[1][:, 0] == 0).all()  # HF 4.x: masked probs
    sdpa = bertlib.bert_forward(sd, config, **batch, head_mask=factors, attn_implementation="sdpa")
    assert_close(sdpa.last_hidden_state[real], masked.last_hidden_state[real], **F64)
    one_row = bertlib.bert_forward(sd, config, **batch, head_mask=factors[1])  # (heads,): every layer alike
    expanded = bertlib.bert_forward(sd, config, **batch, head_mask=factors[1].expand(2, 4))
    assert_close(one_row.last_hidden_state, expanded.last_hidden_state, atol=0.0, rtol=0.0)


def test_head_mask_bad_input():
    sd, config, _ = random_model(seed=0)
    batch = random_inputs(config, batch=2, seq=5, seed=1)
    with pytest.raises(ValueError, match=r"\(4,\) or \(2, 4\)"):
        bertlib.bert_forward(sd, config, **batch, head_mask=torch.ones(3))
    with pytest.raises(TypeError, match="floating-point"):
        bertlib.bert_forward(sd, config, **batch, head_mask=torch.ones(4, dtype=torch.long))
    with pytest.raises(ValueError, match="one factor per head"):
        bertlib.self_attention(sd, config, torch.randn(1, 5, config.hidden_size), head_mask=torch.ones(2, 4))


@pytest.mark.parametrize("prune", [{0: [1]}, {0: [0, 3], 1: [2]}, {1: [0, 1, 2, 3]}, {0: [2], 1: [1, 3]}],
                         ids=["one", "three", "whole-layer", "mixed"])
def test_pruning_equals_masking_random_model(prune):
    sd, config, _ = random_model(seed=3, dtype=torch.float64)
    batch = random_inputs(config, batch=3, seq=11, seed=4)
    real = batch["attention_mask"].bool()
    pruned, pruned_config = HP.prune(sd, config, prune)
    assert HP.heads_per_layer(pruned, config) == [4 - len(prune.get(i, [])) for i in range(2)]
    assert pruned_config.pruned_heads == prune and not getattr(config, "pruned_heads", None)  # config not changed
    ours = bertlib.bert_forward(pruned, pruned_config, **batch)
    ref = bertlib.bert_forward(sd, config, **batch, head_mask=HP.head_mask_for(config, prune, dtype=torch.float64))
    assert_close(ours.last_hidden_state[real], ref.last_hidden_state[real], **F64)
    assert_close(ours.pooler_output, ref.pooler_output, **F64)
    sdpa = bertlib.bert_forward(pruned, pruned_config, **batch, attn_implementation="sdpa")
    assert_close(sdpa.last_hidden_state[real], ref.last_hidden_state[real], **F64)
    d = config.hidden_size // config.num_attention_heads
    removed = sum(len(v) for v in prune.values())
    per_head = 4 * d * config.hidden_size + 3 * d
    assert HP.attention_parameters(sd, config) - HP.attention_parameters(pruned, config) == removed * per_head


def test_pruning_in_steps_keeps_original_head_numbers():
    """HF 4.x semantics (PreTrainedModel.prune_heads, find_pruneable_heads_and_indices): heads keep their original
    numbers across calls, heads already pruned are ignored, repeats count once, layer -1 is the last layer, and
    config.pruned_heads records the union."""
    sd, config, _ = random_model(seed=5, dtype=torch.float64)
    batch = random_inputs(config, batch=2, seq=7, seed=6)
    at_once, at_once_config = HP.prune(sd, config, {0: [1, 3], 1: [2]})
    first, first_config = HP.prune(sd, config, {0: [1]})
    second, second_config = HP.prune(first, first_config, {0: [3, 1, 3], -1: [2]})  # 1 again: ignored
    for k in at_once:
        assert torch.equal(at_once[k], second[k]), k
    assert second_config.pruned_heads == at_once_config.pruned_heads == {0: [1, 3], 1: [2]}
    same, same_config = HP.prune(second, second_config, {0: [1, 3]})  # nothing new: nothing changes
    assert all(same[k] is second[k] for k in second) and same_config.pruned_heads == second_config.pruned_heads
    assert_close(bertlib.bert_forward(second, second_config, **batch).last_hidden_state,
                 bertlib.bert_forward(at_once, at_once_config, **batch).last_hidden_state, atol=0.0, rtol=0.0)
    with pytest.raises(ValueError, match="heads 0..3"):
        HP.prune(sd, config, {0: [4]})
    with pytest.raises(ValueError, match="layer 5"):
        HP.prune(sd, config, {5: [0]})
    with pytest.raises(ValueError, match="layer -3"):
        HP.prune(sd, config, {-3: [0]})
    with pytest.raises(TypeError, match="mapping"):
        HP.prune(sd, config, [(0, 1)])
    with pytest.raises(ValueError, match="layer 0's attention weights hold 3 heads.*prune\\(\\) returned"):
        bertlib.bert_forward(first, config, **batch)  # pruned weights, unpruned config: a short error
    assert torch.equal(bertlib.bert_forward(sd, config, **batch).last_hidden_state,
                       bertlib.bert_forward(*HP.prune(sd, config, {}), **batch).last_hidden_state)


def test_pruned_weights_run_in_transformers_5(pretrained, real_batch):
    """transformers 5.x has no prune_heads, but its BertSelfAttention infers the number of heads from the query
    output width (view(..., -1, head_size)): swapping in smaller nn.Linear layers, as 4.x's prune_linear_layer did,
    runs the pruned weights through HF's own code."""
    sd, config = pretrained.state_dict, pretrained.config
    prune = {0: [0, 5], 2: list(range(config.num_attention_heads // 2)), config.num_hidden_layers - 1: [3]}
    pruned, pruned_config = HP.prune(sd, config, prune)
    hf = copy.deepcopy(bertlib.to_hf_model(pretrained, attn_implementation="eager"))
    with torch.no_grad():
        for i, layer in enumerate(hf.encoder.layer):
            att = layer.attention
            for n in ("query", "key", "value"):
                w = pruned[f"encoder.layer.{i}.attention.self.{n}.weight"]
                lin = nn.Linear(w.shape[1], w.shape[0]).to(w)
                lin.weight.copy_(w)
                lin.bias.copy_(pruned[f"encoder.layer.{i}.attention.self.{n}.bias"])
                setattr(att.self, n, lin)
            w = pruned[f"encoder.layer.{i}.attention.output.dense.weight"]
            dense = nn.Linear(w.shape[1], w.shape[0]).to(w)
            dense.weight.copy_(w)
            dense.bias.copy_(pruned[f"encoder.layer.{i}.attention.output.dense.bias"])
            att.output.dense = dense
        ref = hf(**real_batch).last_hidden_state
        # bertlib.to_hf_model does the same swap for a pruned config
        ref2 = bertlib.to_hf_model(bertlib.Pretrained(pruned, pruned_config, None, "pruned"))(**real_batch)
    assert torch.equal(ref2.last_hidden_state, ref)
    ours = bertlib.bert_forward(pruned, pruned_config, **real_batch).last_hidden_state
    masked = bertlib.bert_forward(sd, config, **real_batch,
                                  head_mask=HP.head_mask_for(config, prune, device=ours.device))
    real = real_batch["attention_mask"].bool()
    assert_close(ours[real], ref[real], **F32)
    assert_close(ours[real], masked.last_hidden_state[real], **F32)


def test_head_importance_is_the_mask_gradient():
    """|dL/dm| at m = 1 against a central finite difference in float64, and the per-layer normalisation."""
    sd, config, _ = random_model(seed=7, dtype=torch.float64)
    batches = [random_inputs(config, batch=2, seq=6, seed=s) for s in (8, 9)]
    w = torch.randn(config.hidden_size, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def loss_fn(out, batch):
        return (out.pooler_output @ w).pow(2).mean()

    raw = HP.head_importance(sd, config, batches, loss_fn, normalize=False)
    eps = 1e-6
    for layer, head in [(0, 2), (1, 0)]:
        fd = 0.0
        for b in batches:
            def loss_at(delta, layer=layer, head=head, b=b):
                m = torch.ones(config.num_hidden_layers, config.num_attention_heads, dtype=torch.float64)
                m[layer, head] += delta
                return loss_fn(bertlib.bert_forward(sd, config, **b, head_mask=m), b).item()
            fd += abs((loss_at(eps) - loss_at(-eps)) / (2 * eps))
        assert abs(raw[layer, head].item() - fd) < 1e-6 * max(1.0, fd), (raw[layer, head].item(), fd)
    # at another point: head (0, 1) already switched off
    start = torch.ones(config.num_hidden_layers, config.num_attention_heads, dtype=torch.float64)
    start[0, 1] = 0.0
    at_start = HP.head_importance(sd, config, batches, loss_fn, normalize=False, head_mask=start)
    fd = 0.0
    for b in batches:
        plus, minus = start.clone(), start.clone()
        plus[1, 2] += eps
        minus[1, 2] -= eps
        fd += abs((loss_fn(bertlib.bert_forward(sd, config, **b, head_mask=plus), b).item()
                   - loss_fn(bertlib.bert_forward(sd, config, **b, head_mask=minus), b).item()) / (2 * eps))
    assert abs(at_start[1, 2].item() - fd) < 1e-6 * max(1.0, fd)
    assert not torch.allclose(at_start, raw)
    with pytest.raises(ValueError, match="layers, heads"):
        HP.head_importance(sd, config, batches, loss_fn, head_mask=torch.ones(4))
    norm = HP.head_importance(sd, config, batches, loss_fn)
    assert_close(norm, raw / raw.norm(dim=1, keepdim=True), **F64)
    order = HP.prune_order(norm)
    assert len(order) == 8 and len(set(order)) == 8
    values = [norm[layer, head].item() for layer, head in order]
    assert values == sorted(values)
    assert HP.as_heads_to_prune([(1, 3), (0, 2), (1, 0)]) == {0: [2], 1: [0, 3]}
    with pytest.raises(ValueError, match="at least one batch"):
        HP.head_importance(sd, config, [], loss_fn)
