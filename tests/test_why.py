"""The why-experiments of chapters 3 (why normalise) and 5 (why several heads): bertlib.course.why_normalise and
bertlib.course.why_heads against independent references (Hugging Face with its LayerNorms removed, hand-written
attention, zeroed weights). What training achieves is asserted in the chapters, with measured margins."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

import bertlib
from bertlib.course.why_heads import OneAttentionLayer, ablate_heads, neighbours_task, pair_accuracy, pair_loss
from bertlib.course.why_normalise import ToyStack, encoder_layer_without_norm, residual_rms, teacher_task, train
from bertlib.training.pretraining import init_state_dict


@pytest.fixture(scope="module")
def tiny():
    """A random BERT (3 layers, hidden 32, 4 heads), its HF twin, and a padded batch of random ids."""
    config = BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=32, attn_implementation="eager")
    sd = init_state_dict(config, seed=0, heads=False)
    hf = BertModel(config, add_pooling_layer=False).eval()
    hf.load_state_dict({k: v for k, v in sd.items() if not k.startswith("pooler")}, strict=False)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 60, (2, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return sd, config, hf, ids, mask


def test_removing_every_layer_norm_matches_hf_with_identities(tiny):
    sd, config, hf, ids, mask = tiny
    real = mask.bool()
    with torch.no_grad():
        states = hf(ids, attention_mask=mask, output_hidden_states=True).hidden_states
        ref = [h[real].pow(2).mean().sqrt().item() for h in states]
        assert residual_rms(sd, config, ids, mask, normalise=True) == pytest.approx(ref, rel=1e-5)
        for name, _ in list(hf.named_modules()):  # every LayerNorm becomes the identity
            if name.endswith("LayerNorm"):
                hf.get_submodule(name.rsplit(".", 1)[0]).LayerNorm = torch.nn.Identity()
        plain = hf(ids, attention_mask=mask, output_hidden_states=True).hidden_states
    ours = residual_rms(sd, config, ids, mask, normalise=False)
    assert ours == pytest.approx([h[real].pow(2).mean().sqrt().item() for h in plain], rel=1e-5)
    assert len(ours) == config.num_hidden_layers + 1


def test_layer_without_norm_is_the_layer_minus_its_layer_norms(tiny):
    sd, config, _, _, _ = tiny
    h = torch.randn(2, 5, config.hidden_size, generator=torch.Generator().manual_seed(1))
    flat = dict(sd)
    out = encoder_layer_without_norm(sd, config, h)  # compared with the two residual sums written out
    ctx, _ = bertlib.self_attention(sd, config, h)
    p = "encoder.layer.0."
    mid = h + F.linear(ctx, flat[p + "attention.output.dense.weight"], flat[p + "attention.output.dense.bias"])
    ffn = F.linear(F.gelu(F.linear(mid, flat[p + "intermediate.dense.weight"], flat[p + "intermediate.dense.bias"])),
                   flat[p + "output.dense.weight"], flat[p + "output.dense.bias"])
    torch.testing.assert_close(out, mid + ffn, atol=1e-6, rtol=1e-5)


def test_toy_stack_scale_with_and_without_layer_norm():
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    out, with_ln = ToyStack(16, 16, 12, 3, norm=True, seed=0)(x)
    _, without = ToyStack(16, 16, 12, 3, norm=False, seed=0)(x)
    assert out.shape == (64, 3) and len(with_ln) == len(without) == 13
    assert with_ln[1:] == pytest.approx([1.0] * 12, abs=1e-5)  # gamma 1, beta 0: mean 0, variance 1
    assert without[0] == pytest.approx(with_ln[0])  # the same input map
    # residual additions of N(0, 1/fan_in) blocks grow
    assert all(b > a for a, b in zip(without, without[1:], strict=False))
    ln, plain = ToyStack(16, 16, 2, 3, norm=True, seed=0), ToyStack(16, 16, 2, 3, norm=False, seed=0)
    assert sum(p.numel() for p in ln.parameters()) == sum(p.numel() for p in plain.parameters())


def test_teacher_task_and_train():
    x, y = teacher_task(300, 8, 4, seed=0)
    assert x.shape == (300, 8) and y.shape == (300,) and set(y.tolist()) <= set(range(4))
    x2, y2 = teacher_task(300, 8, 4, seed=0)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    losses = train(ToyStack(8, 16, 2, 4, seed=0), lambda s: (x, y), F.cross_entropy, steps=30, lr=0.1)
    assert len(losses) == 30 and losses[-1] < losses[0]
    blown = train(ToyStack(8, 16, 2, 4, seed=0), lambda s: (x, y), lambda o, t: F.cross_entropy(o, t) / 0.0,
                  steps=5, lr=0.1)
    assert blown == [math.inf] * 5  # a loss that is not finite stops the run


def test_neighbours_task_targets():
    tokens, targets = neighbours_task(5, 7, 10, seed=0)
    assert tokens.shape == (5, 7) and targets.shape == (5, 7, 2)
    assert torch.equal(targets[:, 1:, 0], tokens[:, :-1]) and torch.equal(targets[:, :-1, 1], tokens[:, 1:])
    assert (targets[:, 0, 0] == -100).all() and (targets[:, -1, 1] == -100).all()


@pytest.mark.parametrize("heads", [1, 4])
def test_one_attention_layer_is_hand_written_attention(heads):
    toy = OneAttentionLayer(10, 6, 16, heads, seed=0)
    tokens, targets = neighbours_task(3, 6, 10, seed=1)
    sd = toy.state_dict_view()
    w = lambda n: (sd[f"encoder.layer.0.attention.{n}.weight"], sd[f"encoder.layer.0.attention.{n}.bias"])  # noqa: E731
    h = toy.token[tokens] + toy.position[:6]
    d = 16 // heads
    q, k, v = (F.linear(h, *w(n)).view(3, 6, heads, d).transpose(1, 2)
               for n in ("self.query", "self.key", "self.value"))
    context = ((q @ k.transpose(-1, -2)) / math.sqrt(d)).softmax(-1) @ v
    h = h + F.linear(context.transpose(1, 2).reshape(3, 6, 16), *w("output.dense"))
    expected = (h @ toy.readout.T).view(3, 6, 2, 10)
    torch.testing.assert_close(toy(tokens), expected, atol=1e-5, rtol=1e-5)
    other = OneAttentionLayer(10, 6, 16, 2)
    assert sum(p.numel() for p in toy.parameters()) == sum(p.numel() for p in other.parameters())
    prev, nxt = pair_accuracy(expected, targets)
    right = expected.argmax(-1) == targets
    assert prev == pytest.approx(right[:, 1:, 0].float().mean().item())
    assert nxt == pytest.approx(right[:, :-1, 1].float().mean().item())
    summed = lambda k, sl: F.cross_entropy(expected[:, sl, k].reshape(-1, 10), targets[:, sl, k].reshape(-1),  # noqa: E731
                                           reduction="sum").item()
    total = summed(0, slice(1, None)) + summed(1, slice(None, -1))  # 5 + 5 targets per sequence, 3 sequences
    assert pair_loss(expected, targets).item() == pytest.approx(total / 30, rel=1e-5)


def test_ablate_heads_is_zeroing_a_heads_values(tiny):
    sd, config, _, ids, mask = tiny
    batch = dict(input_ids=ids, attention_mask=mask)
    change = lambda full, ablated: (ablated - full)[mask.bool()].abs().max().item()  # noqa: E731
    effect = ablate_heads(sd, config, batch, change)
    assert effect.shape == (config.num_hidden_layers, config.num_attention_heads)
    full = bertlib.bert_forward(sd, config, ids, mask).last_hidden_state
    for layer, head in [(0, 0), (2, 3)]:
        zeroed = dict(sd)
        for n in ("weight", "bias"):
            key = f"encoder.layer.{layer}.attention.self.value.{n}"
            zeroed[key] = sd[key].clone()
            zeroed[key][bertlib.head_slice(config, head)] = 0.0
        out = bertlib.bert_forward(zeroed, config, ids, mask).last_hidden_state
        assert effect[layer, head].item() == pytest.approx(change(full, out), rel=1e-4, abs=1e-6)
