"""Frozen features (``bertlib.evaluation.features``, chapter 9): the vectors equal Hugging Face's, whole posts average
their windows, the probe's ``C`` is chosen on validation only, and the command writes what chapter 9 reads."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import bertlib
from bertlib.data import batches, newsgroups
from bertlib.data import windows as win
from bertlib.evaluation import features as fz
from helpers import needs_data

POSTS = ["A short post about hockey.",
         "Disk drives and SCSI controllers: " + "the jumper settings on the card matter. " * 12,
         "Faith and belief, " + "and what the bible says about it, " * 30]


def test_frozen_features_equal_hf(pretrained, hf_model):
    seqs = newsgroups.encode(pretrained.tokenizer, POSTS, 64, "head_tail")
    ours = fz.frozen_features(pretrained, seqs, batch_size=2)   # two batches, length-sorted: order restored
    batch = batches.collate(seqs, pretrained.tokenizer.pad_token_id, next(hf_model.parameters()).device)
    with torch.no_grad():
        ref = hf_model(**batch)
    m = batch["attention_mask"].unsqueeze(-1).float()
    tol = bertlib.tolerance(batch["input_ids"].device)
    torch.testing.assert_close(ours["[CLS]"], ref.last_hidden_state[:, 0].cpu(), **tol)
    torch.testing.assert_close(ours["pooler"], ref.pooler_output.cpu(), **tol)
    torch.testing.assert_close(ours["mean"], ((ref.last_hidden_state * m).sum(1) / m.sum(1)).cpu(), **tol)


def test_whole_posts_average_their_windows(pretrained):
    tok = pretrained.tokenizer
    whole = fz.post_features(pretrained, POSTS, 32, "windows", stride=4)
    cut = fz.post_features(pretrained, POSTS, 32, "truncated", truncation="head")
    seqs, post = win.encode_windows(tok, POSTS, 32, 4)
    per_window = fz.frozen_features(pretrained, seqs)
    assert np.bincount(post)[0] == 1 and np.bincount(post)[2] > 3       # one short post, one long one
    tol = bertlib.tolerance("cpu")
    for kind in fz.KINDS:
        torch.testing.assert_close(torch.as_tensor(whole[kind][0]), torch.as_tensor(cut[kind][0]), **tol)
        torch.testing.assert_close(torch.as_tensor(whole[kind][2]), per_window[kind][post == 2].mean(0), **tol)
        assert not np.allclose(whole[kind][2], cut[kind][2], atol=1e-3)  # the long post reads differently
    with pytest.raises(ValueError, match="reading must be one of"):
        fz.post_features(pretrained, POSTS, 32, "middle")


def test_probe_C_is_chosen_on_validation_only():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(3, 8))

    def draw(n: int, noise: float):
        y = rng.integers(0, 3, n)
        return centres[y] + noise * rng.normal(size=(n, 8)), y

    (X, y), (Xv, yv) = draw(90, 2.0), draw(60, 2.0)
    grid = (1e-4, 0.1, 10.0)
    probe = fz.fit_probe(X, y, Xv, yv, grid)
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    accs = [make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=5000)).fit(X, y).score(Xv, yv)
            for C in grid]
    assert probe.C == grid[int(np.argmax(accs))] and probe.val_accuracy == max(accs)
    assert np.array_equal(probe.predict(Xv) == yv, probe.model.predict(Xv) == yv)


@needs_data
def test_command_writes_every_reading_and_kind(tmp_path, capsys, tiny_checkpoint):
    """``bertlib-features`` through its entry point, in this process (no interpreter to start), on the tiny
    random BERT (the files and their fields are the same for any weights)."""
    args = ["--profile", "quick", "--train-size", "60", "--val-fraction", "0.1", "--test-size", "40", "--max-length",
            "32", "--window-stride", "8", "--data-seed", "1", "--device", "cpu", "--model", str(tiny_checkpoint),
            "--out", str(tmp_path)]
    assert fz.main(args) == 0
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert m["command"] == "python -m bertlib.evaluation.features " + " ".join(args)
    assert (m["train_size"], m["val_size"], m["test_size"], m["max_length"]) == (40, 20, 40, 32)
    assert set(m["results"]) == {f"{r}/{k}" for r in fz.READINGS for k in fz.KINDS}
    for row in m["results"].values():
        assert 0 <= row["accuracy"] <= 1 and row["C"] in fz.PROBE_C and len(row["per_class_f1"]) == 20
    capsys.readouterr()
    assert fz.main([*args[:-2], "--window-stride", "30", "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Lower --window-stride" in err
    assert not (tmp_path / "bad").exists(), "nothing is loaded or written before the settings are checked"


def test_command_has_its_own_options(capsys):
    """``bertlib-features`` parses its own options: ``--help`` names the command and none of fine-tuning's
    training options, and a fine-tuning option such as ``--epochs`` is an error, not silently accepted."""
    with pytest.raises(SystemExit) as ok:
        fz.parse_args(["--help"])
    out = capsys.readouterr().out
    assert ok.value.code == 0 and out.startswith("usage: bertlib-features")
    assert "--train-size" in out and "--window-stride" in out and "--epochs" not in out and "--lr" not in out
    with pytest.raises(SystemExit) as bad:
        fz.parse_args(["--out", "x", "--epochs", "3"])
    assert bad.value.code == 2 and "--epochs" in capsys.readouterr().err
    cfg = fz.parse_args(["--out", "x", "--profile", "cpu"])
    assert (cfg.train_size, cfg.test_size, cfg.window_stride) == (None, None, 0)
    assert fz.parse_args(["--out", "x", "--profile", "cpu", "--window-stride", "5"]).window_stride == 5
