"""bertlib.perf.bench_training (appendix 14, section 14.9): the fine-tuning step timed against ``transformers.Trainer``.

The rows are only as good as what they time: the padding-free step must compute chapter 9's update, and the
``Trainer`` row must train the same model on the same batches. Both are checked here on the tiny random BERT, with
dropout off; the timing itself runs end to end on two small rounds.
"""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from transformers import TrainerCallback

from bertlib.perf import bench_training as BT
from bertlib.tasks.classifier import BertClassifier
from bertlib.training.optimization import adamw
from helpers import needs_data


def _batch(config, lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, config.vocab_size, (len(lengths), max(lengths)), generator=g)
    mask = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    ids[mask == 0] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _no_dropout(config):
    return config.__class__.from_dict({**config.to_dict(), "hidden_dropout_prob": 0.0,
                                       "attention_probs_dropout_prob": 0.0})


def _gradients(model, batch, labels) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Chapter 9's loss and its gradient, clipped as train_step clips it (AdamW's first step would turn tiny
    float differences into steps of size lr, so the gradients are compared, not the updated weights)."""
    loss = F.cross_entropy(model(**batch), labels)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), BT.MAX_GRAD_NORM)
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_padding_free_step_is_the_padded_step(tiny_pretrained):
    """A batch with padding: the padding-free path's loss and gradient equal the padded path's."""
    config = _no_dropout(tiny_pretrained.config)
    batch, labels = _batch(config, [24, 9, 17]), torch.tensor([0, 3, 1])
    got = {attn: _gradients(BertClassifier(tiny_pretrained.state_dict, config, 5, attn_implementation=attn,
                                           fused=True).train(), batch, labels) for attn in ("sdpa", "unpadded")}
    torch.testing.assert_close(got["unpadded"][0], got["sdpa"][0], atol=1e-6, rtol=1e-6)
    for name, g in got["sdpa"][1].items():
        torch.testing.assert_close(got["unpadded"][1][name], g, atol=1e-7, rtol=1e-4, msg=name)


def test_trainer_row_trains_the_same_model(tiny_pretrained):
    """Trainer's step and chapter 9's, from the same weights on the same batch (no dropout): the same clipped
    gradient reaches the same optimizer (fused AdamW, the same settings and weight-decay groups); the batches go in
    the order given; the Trainer's seeding does not leak into the caller's generators."""
    import random

    import numpy as np

    pt = dataclasses.replace(tiny_pretrained, config=_no_dropout(tiny_pretrained.config))
    batches = [(_batch(pt.config, lengths, seed=i), torch.tensor([4, 0, 2]))
               for i, lengths in enumerate([[20, 20, 11], [7, 3, 5], [13, 13, 13]])]
    ours = BT._bertlib_runner(pt, 5, "sdpa")
    _, expected = _gradients(ours.model, *batches[0])

    class Grab(TrainerCallback):
        grads, optimizer = None, None

        def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
            if self.grads is None:  # the first step's
                self.grads = {n: p.grad.clone() for n, p in model.named_parameters()}
                self.optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate wraps it

    grab = Grab()
    theirs = BT._trainer_runner(pt, 5, torch.device("cpu"), callbacks=(grab,))
    widths = []
    theirs.model.register_forward_pre_hook(lambda m, a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    states = torch.random.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    assert len(theirs(batches)) == 3
    assert widths == [20, 7, 13], "the batches reach the model in the order given"
    assert torch.equal(torch.random.get_rng_state(), states[0]), "the Trainer's seeding must not leak out"
    assert np.array_equal(np.random.get_state()[1], states[1]) and random.getstate() == states[2]
    assert set(grab.grads) == set(expected)  # BertForSequenceClassification's names are BertClassifier's
    for name, g in expected.items():
        torch.testing.assert_close(grab.grads[name], g, atol=1e-7, rtol=1e-4, msg=name)
    mine = adamw(ours.model, BT.LR, BT.WEIGHT_DECAY)
    assert grab.optimizer.defaults["fused"] and type(grab.optimizer) is type(mine)
    for key in ("lr", "betas", "eps"):
        assert grab.optimizer.defaults[key] == mine.defaults[key], key
    decayed = {id(p) for g in grab.optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {id(p): n for n, p in theirs.model.named_parameters()}
    ours_decayed = {n for g in mine.param_groups if g["weight_decay"] > 0 for n, p in ours.model.named_parameters()
                    if any(p is q for q in g["params"])}
    assert {names[i] for i in decayed} == ours_decayed, "weight decay on the same parameters"


def test_padding_shares_shuffled_and_bucketed():
    assert BT.padding_shares([1, 10, 1, 10], 2)["bucketed"] == 0.0  # sorted: (1, 1), (10, 10)
    lengths = torch.randint(1, 129, (2000,), generator=torch.Generator().manual_seed(0)).numpy()
    shares = BT.padding_shares(lengths, 8, bucket_batches=250)  # one bucket: sorted batches pad least
    assert 0 <= shares["bucketed"] < 0.05 < shares["shuffled"]


@pytest.mark.slow  # Trainer and bertlib, 2 rounds of 2 steps each
@needs_data
def test_training_rows_end_to_end(tiny_pretrained):
    batches = BT.cpu_profile_batches(tiny_pretrained.tokenizer, 4, 4, max_length=32, bucket_batches=2)
    assert all(b["input_ids"].shape[0] == 4 and b["input_ids"].shape[1] <= 32 for b, _ in batches)
    run = BT.training_rows(tiny_pretrained, torch.device("cpu"), batches, rounds=2, steps=2, num_labels=20)
    rows = {r["method"]: r for r in run["rows"]}
    precisions = BT.precisions_for(torch.device("cpu"))
    assert set(rows) == set(run["seconds"]) and len(rows) == 3 * len(precisions)
    assert run["setup"]["precisions"] == list(precisions)
    timed = [batches[1], batches[3]]  # each round's first step is not timed
    assert run["setup"]["tokens"] == sum(int(b["attention_mask"].sum()) for b, _ in timed)
    assert run["setup"]["padding_share"] == round(BT.padding_share(timed), 4)
    for name, r in rows.items():
        trainer = run["seconds"][BT.TRAINER + (BT.BF16 if r["precision"] == "bfloat16" else "")]
        secs = run["seconds"][name]
        assert len(secs) == 2 and all(t > 0 for t in secs)
        assert r["tokens_per_s"] == round(run["setup"]["tokens"] / sum(secs), 1)
        ratios = sorted(t / s for t, s in zip(trainer, secs, strict=True))
        assert (r["speedup_min"], r["speedup_max"]) == (round(ratios[0], 3), round(ratios[-1], 3))
    assert run["setup"]["rounds"] == 2 and run["setup"]["batch_size"] == 4
    with pytest.raises(ValueError, match="batches"):
        BT.training_rows(tiny_pretrained, torch.device("cpu"), batches, rounds=3, steps=2)


def test_bf16_detection_falls_back_to_float32(monkeypatch):
    """Without avx512_bf16 or AMX: bf16_supported is False and autocast_for runs the block in float32."""
    from bertlib.model import runtime

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert not runtime.bf16_supported("cpu") and BT.precisions_for(torch.device("cpu")) == ("float32",)
    with runtime.autocast_for("cpu"):
        assert torch.nn.functional.linear(torch.ones(2, 3), torch.ones(4, 3)).dtype == torch.float32
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert runtime.bf16_supported("cpu") == torch.backends.mkldnn.is_available()
    assert not runtime.bf16_supported("meta")


@pytest.mark.skipif(not BT.bf16_supported("cpu"), reason="no native bfloat16 matrix products on this CPU")
def test_bf16_step_keeps_float32_master_weights_and_is_close(tiny_pretrained):
    """The bf16 step: the products in bfloat16, the weights, gradients and AdamW's state float32; its loss and
    gradient near float32's (bfloat16 keeps 8 bits: a relative error of a few per cent at most, not zero)."""
    batches = [(_batch(tiny_pretrained.config, [24, 9, 17], seed=s), torch.tensor([0, 3, 1])) for s in range(2)]
    err = BT.bf16_step_error(tiny_pretrained, batches, 5)
    assert err["bf16"] and len(err["per_batch"]) == 2
    assert 0 < err["loss_rel"] < 0.02 and 0 < err["grad_rel"] < 0.1 and err["grad_cos"] > 0.99
    run = BT._bertlib_runner(tiny_pretrained, 5, "unpadded", bf16=True)
    run(batches[:1])
    assert all(p.dtype == torch.float32 for p in run.model.parameters())
    state = [t for s in run.optimizer.state.values() for t in s.values() if t.numel() > 1]
    assert state and all(t.dtype == torch.float32 for t in state)  # AdamW's moments: float32


@pytest.mark.slow  # two short fine-tuning runs on the tiny model
@needs_data
def test_time_to_accuracy_curves(tiny_pretrained):
    """Both curves start at step 0 and second 0, score after every eval_every steps and at the end, on the clock
    of training alone (non-decreasing), with accuracies in [0, 1]."""
    seqs, labels = BT.cpu_profile_sequences(tiny_pretrained.tokenizer, 24, 32, windows=False)
    train, val = (seqs[:16], labels[:16]), (seqs[16:], labels[16:])
    for method in (BT.UNPADDED, BT.TRAINER):
        curve = BT.time_to_accuracy(tiny_pretrained, torch.device("cpu"), train, val, method,
                                    BT.CurveSettings(epochs=2, batch_size=4, eval_every=3, bucket_batches=2))
        assert curve["steps"] == [0, 3, 6, 8], method
        assert curve["seconds"][0] == 0 and curve["seconds"] == sorted(curve["seconds"]), method
        assert all(0 <= a <= 1 for a in curve["accuracy"]) and curve["method"] == method
    with pytest.raises(ValueError, match="method must be one of"):
        BT.time_to_accuracy(tiny_pretrained, torch.device("cpu"), train, val, BT.COMPILED,
                            BT.CurveSettings(epochs=1, batch_size=4, eval_every=1))
