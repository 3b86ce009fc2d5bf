"""``python -m bertlib.finetune`` (chapter 9) and the Hugging Face export (chapter 10).

A TINY setting keeps this file to well under two minutes of CPU: 120 training posts (100 to train, 20 held out),
40 test posts, 64 tokens, 6 optimizer steps. Three runs of the real command, as subprocesses:

* ``A``: uninterrupted;
* ``B``: the same command with ``--stop-after-steps 3`` (a simulated interruption), then the same command again,
  which resumes from ``checkpoint.pt``.

On CPU the resumed run is bit-for-bit the uninterrupted one (same weights, optimizer state, data order and
dropout masks), so metrics are compared exactly; losses are compared to 1e-6 relative only to tolerate a GPU's
non-deterministic kernels, should these tests run on one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import load_file

import bertlib
from bertlib import finetune as ft
from bertlib.export import export_hf, hf_config
from conftest import DEVICE, _data_available, finish

ROOT = Path(__file__).resolve().parent.parent
TINY = ["--profile", "quick", "--train-size", "120", "--test-size", "40", "--max-length", "64", "--max-steps", "6",
        "--seed", "3", "--checkpoint-every", "100", "--device", "cpu"]
TINY_CFG = dict(train_size=120, test_size=40, max_length=64, max_steps=6, seed=3, checkpoint_every=100, device="cpu")
METRIC_KEYS = {"accuracy", "macro_f1", "per_class_f1", "profile", "device", "epochs", "wall_time_s", "tokens_per_s",
               "history", "seed", "max_length", "train_size", "test_size", "remove_headers", "truncation",
               "final_train_loss", "best_epoch", "best_val_accuracy", "steps"}

needs_data = pytest.mark.skipif(not _data_available(), reason="20 Newsgroups offline: set BERTLIB_20NG_ARCHIVE")


def _command(out: Path, *extra: str) -> subprocess.Popen:
    # One thread each: the runs being compared must reduce in the same order, and two run side by side.
    env = dict(os.environ, CI="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "bertlib.finetune", "--out", str(out), *TINY, *extra],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path | str]:
    """Directory A (uninterrupted), directory B (stopped after 3 steps, then resumed), and their logs."""
    a, b = tmp_path_factory.mktemp("uninterrupted"), tmp_path_factory.mktemp("resumed")
    first, stopped = _command(a), _command(b, "--stop-after-steps", "3")
    log_a, log_stop = finish(first), finish(stopped)
    assert (b / ft.CHECKPOINT).exists() and not (b / ft.METRICS).exists(), "the interrupted run left no checkpoint"
    log_resume = finish(_command(b))
    return {"a": a, "b": b, "log_a": log_a, "log_stop": log_stop, "log_resume": log_resume}


@pytest.fixture(scope="module")
def tiny_data() -> ft.NewsData:
    return ft.load_data(ft.profile_config("quick", **TINY_CFG))


@needs_data
def test_command_writes_metrics_weights_and_hf_export(runs):
    out, log = runs["a"], runs["log_a"]
    assert "profile=quick" in log and "[finetune] epoch 1/" in log
    for name in ("metrics.json", "model.safetensors", "checkpoint.pt", "hf/config.json", "hf/model.safetensors",
                 "hf/tokenizer.json", "hf/tokenizer_config.json"):
        assert (out / name).is_file(), f"{name} missing"
    m = json.loads((out / "metrics.json").read_text())
    assert METRIC_KEYS <= m.keys(), f"missing keys: {METRIC_KEYS - m.keys()}"
    assert m["profile"] == "quick" and m["device"] == "cpu" and m["steps"] == 6 and m["max_length"] == 64
    assert (m["train_size"], m["val_size"], m["test_size"]) == (100, 20, 40)
    # six steps on 100 posts of 20 classes learn nothing measurable (accuracy 0.05-0.10 over seeds 0-5): learning
    # is checked by test_training_learns_four_classes; here, that the figures are the 40 test posts' own
    assert round(m["accuracy"] * 40, 6).is_integer(), m["accuracy"]
    assert m["macro_f1"] == pytest.approx(np.mean(list(m["per_class_f1"].values())), abs=1e-12)
    assert m["wall_time_s"] > 0 and m["tokens_per_s"] > 0 and m["truncation"] == "head_tail"
    names = bertlib.data.load_20newsgroups("train").target_names
    assert list(m["per_class_f1"]) == names
    assert len(m["history"]) == 1 and {"train_loss", "val_loss", "val_accuracy"} <= m["history"][0].keys()
    config = json.loads((out / "hf/config.json").read_text())
    assert config["architectures"] == ["BertForSequenceClassification"]
    assert config["id2label"] == {str(i): n for i, n in enumerate(names)}
    # the best weights carry BertForSequenceClassification's names
    keys = set(load_file(str(out / "model.safetensors")))
    assert "classifier.weight" in keys and "bert.embeddings.word_embeddings.weight" in keys


@needs_data
def test_resume_reaches_the_same_metrics(runs):
    a = json.loads((runs["a"] / "metrics.json").read_text())
    b = json.loads((runs["b"] / "metrics.json").read_text())
    assert "stopped after 3 steps" in runs["log_stop"] and "resuming from" in runs["log_resume"]
    assert (a["segments"], b["segments"]) == (1, 2) and a["steps"] == b["steps"] == 6
    for key in ("accuracy", "macro_f1", "per_class_f1", "best_epoch", "train_tokens"):
        assert a[key] == b[key], f"{key}: uninterrupted {a[key]} != resumed {b[key]}"

    def losses(m):
        return [m["final_train_loss"], *m["train_loss_curve"]] + [
            h[k] for h in m["history"] for k in ("train_loss", "val_loss", "val_accuracy")]

    np.testing.assert_allclose(losses(b), losses(a), rtol=1e-6, atol=0)
    wa, wb = load_file(str(runs["a"] / "model.safetensors")), load_file(str(runs["b"] / "model.safetensors"))
    for k in wa:  # the weights themselves: equal on CPU
        torch.testing.assert_close(wb[k], wa[k], atol=1e-6, rtol=0)


@needs_data
def test_checkpoint_holds_everything_a_resume_needs(runs):
    ckpt = torch.load(runs["b"] / "checkpoint.pt", map_location="cpu", weights_only=False)
    assert {"model", "optimizer", "scheduler", "run", "rng", "config"} <= ckpt.keys()
    assert {"torch", "numpy", "python"} <= ckpt["rng"].keys()
    assert ckpt["run"]["step"] == 6 and ckpt["run"]["finished"] and ckpt["run"]["segments"] == 2
    assert ckpt["config"]["seed"] == 3 and ckpt["scheduler"]["last_epoch"] == 6


@needs_data
def test_resume_refuses_a_checkpoint_of_other_settings(runs, pretrained, tiny_data):
    cfg = ft.profile_config("quick", **{**TINY_CFG, "seed": 4})
    with pytest.raises(ValueError, match="other settings"):
        ft.train(cfg, runs["b"], data=tiny_data, pretrained=pretrained, verbose=False)


def _our_classifier(pretrained, weights: Path, n_labels: int) -> bertlib.BertClassifier:
    model = bertlib.BertClassifier(pretrained.state_dict, pretrained.config, n_labels, attn_implementation="eager")
    model.load_state_dict(load_file(str(weights)), strict=True)
    return model.to(DEVICE).eval()


@needs_data
def test_pipeline_returns_bertlib_label_and_score(runs, pretrained, tiny_data):
    """transformers.pipeline on the exported directory = softmax of bertlib's logits, label by label."""
    texts = tiny_data.test.texts[:8]  # real posts, longer than 64 tokens: both sides cut at the head
    ours = _our_classifier(pretrained, runs["a"] / "model.safetensors", len(tiny_data.label_names))
    seqs = ft.encode(pretrained.tokenizer, texts, 64, "head")
    probs = ft.predict_logits(ours, seqs, pretrained.tokenizer.pad_token_id, device=DEVICE).softmax(-1)
    pipe = transformers.pipeline("text-classification", model=str(runs["a"] / "hf"), device=DEVICE)
    theirs = pipe(texts, truncation=True, max_length=64)
    top2 = probs.topk(2, dim=-1).values
    for i, out in enumerate(theirs):
        torch.testing.assert_close(torch.tensor(out["score"]), probs[i].max(), atol=2e-6, rtol=0)
        if top2[i, 0] - top2[i, 1] > 1e-4:  # a near-tie may flip on float noise; none is expected
            assert out["label"] == tiny_data.label_names[int(probs[i].argmax())]


@needs_data
def test_from_pretrained_logits_equal_ours(runs, pretrained, tiny_data):
    texts = tiny_data.test.texts[8:12] + bertlib.data.example_sentences(2, seed=1)  # long posts and short sentences
    ours = _our_classifier(pretrained, runs["a"] / "model.safetensors", len(tiny_data.label_names))
    hf = transformers.BertForSequenceClassification.from_pretrained(runs["a"] / "hf", attn_implementation="eager")
    hf = hf.to(DEVICE).eval()
    batch = pretrained.tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt").to(DEVICE)
    assert (batch["attention_mask"] == 0).any(), "the batch should be padded"
    with torch.no_grad():
        torch.testing.assert_close(ours(**batch), hf(**batch).logits, **bertlib.tolerance(DEVICE))


# --------------------------------------------------------------------------------- pieces, no data needed


def test_head_truncation_is_the_tokenizers(pretrained):
    tok = pretrained.tokenizer
    texts = ["word " * 300, "a short post.", "x " * 62]
    ours = ft.encode(tok, texts, 64, "head")
    assert ours == tok(texts, truncation=True, max_length=64)["input_ids"]


def test_head_tail_keeps_both_ends():
    body = list(range(1000, 2000))
    ids = ft.truncate(body, 512, "head_tail", cls_id=101, sep_id=102)
    assert len(ids) == 512 and ids[0] == 101 and ids[-1] == 102
    assert ids[1:129] == body[:128] and ids[129:-1] == body[-382:]  # Sun et al.: 128 + 382
    short = ft.truncate(body[:10], 512, "head_tail", 101, 102)
    assert short == [101, *body[:10], 102]
    assert ft.head_tokens(128) == 32 and len(ft.truncate(body, 128, "head_tail", 101, 102)) == 128
    with pytest.raises(ValueError, match="truncation"):
        ft.truncate(body, 64, "middle", 101, 102)


def test_epoch_batches_are_a_pure_function_of_seed_and_epoch():
    lengths = np.random.default_rng(0).integers(5, 500, size=1003)
    b0 = ft.epoch_batches(lengths, 16, seed=7, epoch=0, bucket_batches=10)
    again = ft.epoch_batches(lengths, 16, seed=7, epoch=0, bucket_batches=10)
    assert all(np.array_equal(x, y) for x, y in zip(b0, again, strict=True))
    assert sorted(np.concatenate(b0).tolist()) == list(range(1003)), "every post exactly once"
    b1 = ft.epoch_batches(lengths, 16, seed=7, epoch=1, bucket_batches=10)
    assert not all(np.array_equal(x, y) for x, y in zip(b0, b1, strict=True)), "another epoch, another order"

    def padding(bs):
        return sum(int(lengths[b].max() * len(b) - lengths[b].sum()) for b in bs)

    random_batches = np.array_split(np.random.default_rng(1).permutation(1003), len(b0))
    assert padding(b0) < 0.2 * padding(random_batches), "bucketing should remove most padding"


def test_schedule_warms_up_then_decays():
    f = ft.linear_schedule(warmup=10, total=100)
    values = [f(s) for s in range(101)]
    assert 0 < values[0] < values[9] <= 1.0 and values[10] == 1.0 and values[100] == 0.0
    assert all(a >= b for a, b in zip(values[10:], values[11:], strict=False))


def test_no_weight_decay_on_biases_and_layernorm(pretrained):
    """The groups hold named parameters where BERT puts them (checked by name, not by the code's own rule)."""
    model = bertlib.BertClassifier(pretrained.state_dict, pretrained.config, 3)
    cfg = ft.profile_config("quick", weight_decay=0.01, lr=1e-4, head_lr=1e-3)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = ft.param_groups(model, cfg)
    assert sorted(names[id(p)] for g in groups for p in g["params"]) == sorted(names.values()), "each once"
    group_of = {names[id(p)]: (g["weight_decay"], g["lr"]) for g in groups for p in g["params"]}
    layer = "bert.encoder.layer.0."
    no_decay = ["bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias",
                layer + "attention.output.LayerNorm.weight", layer + "attention.output.LayerNorm.bias",
                layer + "attention.output.dense.bias", layer + "attention.self.query.bias",
                layer + "intermediate.dense.bias", layer + "output.LayerNorm.weight", layer + "output.dense.bias",
                "bert.pooler.dense.bias"]
    decay = ["bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
             layer + "attention.output.dense.weight", layer + "attention.self.query.weight",
             layer + "attention.self.key.weight", layer + "intermediate.dense.weight", layer + "output.dense.weight",
             "bert.pooler.dense.weight"]
    for name in no_decay:
        assert group_of[name] == (0.0, 1e-4), name
    for name in decay:
        assert group_of[name] == (0.01, 1e-4), name
    assert group_of["classifier.weight"] == (0.01, 1e-3) and group_of["classifier.bias"] == (0.0, 1e-3)
    # per layer: 6 matrices with their 6 biases, 2 LayerNorms (weight and bias); outside: 3 embedding tables and
    # their LayerNorm, the pooler and the classifier (weight and bias each)
    n_layers = pretrained.config.num_hidden_layers
    assert sum(1 for wd, _ in group_of.values() if wd == 0.0) == n_layers * (6 + 4) + 2 + 2
    assert sum(1 for wd, _ in group_of.values() if wd == 0.01) == n_layers * 6 + 3 + 2


#: Four far-apart newsgroups, so that a short run shows whether fine-tuning learns (chance: 0.25).
FOUR = ["comp.graphics", "rec.sport.hockey", "sci.med", "talk.politics.mideast"]


def _four_classes(split: str) -> tuple[list[str], np.ndarray]:
    ds = bertlib.data.load_20newsgroups(split)
    ids = [ds.target_names.index(c) for c in FOUR]
    keep = np.flatnonzero(np.isin(ds.target, ids))
    return [ds.data[i] for i in keep], np.array([ids.index(ds.target[i]) for i in keep])


@needs_data
def test_training_learns_four_classes(pretrained, tmp_path):
    """15 steps (batch 16, 64 tokens) on 79 posts of four newsgroups, scored on 80 held-out test posts. Measured
    test accuracy over seeds 0-7 (seed = data_seed, torch 1 thread): 0.5875 to 0.7875, seed 3: 0.6625 (also with
    2 threads: seed 0 0.6625 at 1 and 2). Chance is 0.25; the bound 0.45 leaves 0.14 below the worst seed."""
    cfg = ft.profile_config("quick", train_size=88, test_size=80, max_length=64, max_steps=15, epochs=100, seed=3,
                            data_seed=3, checkpoint_every=1000, device="cpu")
    data = ft.split_data(*_four_classes("train"), *_four_classes("test"), FOUR, cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = ft.train(cfg, tmp_path, data=data, pretrained=pretrained, export=False, verbose=False)
    finally:
        torch.set_num_threads(threads)
    m = result.metrics
    assert (m["steps"], m["train_size"], m["test_size"]) == (15, 79, 80)
    assert m["accuracy"] >= 0.45, m
    # the last epoch's mean training loss, measured 0.87-1.04 over seeds 0-4, against log 4 = 1.39 for guessing
    assert m["history"][-1]["train_loss"] < 1.25, m["history"]


def test_profiles_and_bad_settings():
    quick, full = ft.profile_config("quick"), ft.profile_config("full")
    assert quick.train_size and quick.max_length <= 128 and full.train_size is None and full.max_length == 512
    assert ft.profile_config("quick", seed=None).seed == 0  # None means "the profile's value"
    with pytest.raises(ValueError, match="profile"):
        ft.profile_config("medium")
    with pytest.raises(ValueError, match="truncation"):
        ft.profile_config("quick", truncation="tail")


def test_export_rejects_wrong_label_names(pretrained, tmp_path):
    model = bertlib.BertClassifier(pretrained.state_dict, pretrained.config, 3)
    with pytest.raises(ValueError, match="label names"):
        export_hf(model, pretrained.tokenizer, ["a", "b"], tmp_path)
    with pytest.raises(ValueError, match="unique"):
        hf_config(model, ["a", "a", "b"])
