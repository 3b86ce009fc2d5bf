"""The committed results files (``results/``) agree with themselves and say what chapter 9b reads from them.

Chapter 9b renders its all-data table from ``results/finetune-cpu*/`` (``bertlib-finetune --profile cpu``)
and ``results/frozen-cpu/`` (``bertlib-features --profile cpu``). These are facts of committed files, not
of a reader's run, so they are checked here, once, rather than in the chapter: each file is consistent with itself
(its confusion matrix and its accuracy-by-length table give back its accuracies), the runs compared read the same
posts, and the statements the chapter's prose makes about them hold. No model is loaded; this runs in a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bertlib.data.corpus import SPLIT_SIZES
from bertlib.training import finetune_config

RESULTS = Path(__file__).resolve().parent.parent / "results"
SETTINGS = {False: "as-distributed", True: "no-headers"}
#: metrics.json rows of a cpu-profile run (the keys of its accuracy-by-length table).
ROWS = ("model", "model_truncated", "tfidf_logreg", "tfidf_svc", "ensemble")
#: What two runs must share to be compared: the same posts, cut the same way.
SAME_POSTS = ("remove_headers", "data_seed", "train_size", "val_size", "test_size", "max_length", "truncation",
              "window_stride")
RELIGION = ("alt.atheism", "soc.religion.christian", "talk.religion.misc")


def load(folder: str, rm: bool) -> dict:
    return json.loads((RESULTS / folder / SETTINGS[rm] / "metrics.json").read_text())


def runs() -> list[tuple[str, bool]]:
    """Every committed fine-tuning run: (folder, setting)."""
    found = []
    for folder in sorted(p.name for p in RESULTS.glob("finetune-cpu*")):
        found += [(folder, rm) for rm, name in SETTINGS.items() if (RESULTS / folder / name / "metrics.json").is_file()]
    return found


def row(m: dict, key: str) -> dict:
    """One row's test accuracy and validation accuracy (and its other fields) in a fine-tuning run's file."""
    if key == "model":
        return {"accuracy": m["accuracy"], "val_accuracy": m["best_val_accuracy"], "per_class_f1": m["per_class_f1"]}
    return m["truncated"] if key == "model_truncated" else m["baselines"][key]


def frozen_row(f: dict, reading: str) -> dict:
    """The frozen vector validation prefers for one reading (``truncated`` or ``windows``); ties: the first."""
    by_kind = {kind: f["results"][f"{reading}/{kind}"] for kind in ("[CLS]", "pooler", "mean")}
    return by_kind[max(by_kind, key=lambda k: by_kind[k]["val_accuracy"])]


def test_the_main_runs_are_committed():
    for rm in SETTINGS:
        for folder in ("finetune-cpu", "finetune-cpu-2-epochs", "frozen-cpu"):
            assert (RESULTS / folder / SETTINGS[rm] / "metrics.json").is_file(), f"{folder}/{SETTINGS[rm]}"
    assert (RESULTS / "finetune-cpu-seed1" / SETTINGS[False] / "metrics.json").is_file()


@pytest.mark.parametrize("folder, rm", runs(), ids=lambda x: x if isinstance(x, str) else SETTINGS[x])
def test_a_run_agrees_with_itself(folder, rm):
    m = load(folder, rm)
    assert m["profile"] == "cpu" and m["remove_headers"] == rm and m["test_size"] == SPLIT_SIZES["test"]
    assert m["train_size"] + m["val_size"] == SPLIT_SIZES["train"]
    cm = np.array(m["confusion_matrix"])
    assert cm.shape == (20, 20) and cm.sum() == m["test_size"]
    assert np.trace(cm) == round(m["accuracy"] * m["test_size"])  # chapter 9b's bootstrap counts these
    assert np.array_equal(cm.sum(1) > 0, np.ones(20, bool))  # rows are the true classes: every class is tested
    for key in ROWS:  # the accuracy-by-length bins give back every row's accuracy
        by_length = sum(b["posts"] * b[key] for b in m["accuracy_by_length"]) / m["test_size"]
        assert abs(by_length - row(m, key)["accuracy"]) < 1e-12, key
        assert float(round(row(m, key)["accuracy"] * m["test_size"])) == pytest.approx(
            row(m, key)["accuracy"] * m["test_size"], abs=1e-6), f"{key}: not a whole number of posts"
    assert sum(b["posts"] for b in m["accuracy_by_length"]) == m["test_size"]
    first = m["accuracy_by_length"][0]  # posts that fit one window: truncated and whole are the same input
    assert first["model"] == first["model_truncated"]
    assert m["best_epoch"] == int(np.argmax([h["val_accuracy"] for h in m["history"]])) + 1


@pytest.mark.parametrize("folder, rm", runs(), ids=lambda x: x if isinstance(x, str) else SETTINGS[x])
def test_every_run_reads_the_same_posts(folder, rm):
    base, m = load("finetune-cpu", rm), load(folder, rm)
    assert all(m[k] == base[k] for k in SAME_POSTS), folder
    f = json.loads((RESULTS / "frozen-cpu" / SETTINGS[rm] / "metrics.json").read_text())
    assert all(f[k] == base[k] for k in SAME_POSTS)


def test_three_epochs_were_chosen_on_validation():
    for rm in SETTINGS:
        two, three = load("finetune-cpu-2-epochs", rm), load("finetune-cpu", rm)
        assert (two["epochs"], three["epochs"]) == (2, finetune_config.PROFILES["cpu"]["epochs"]) == (2, 3)
        assert three["best_val_accuracy"] > two["best_val_accuracy"]


@pytest.mark.parametrize("rm", SETTINGS, ids=SETTINGS.get)
def test_what_chapter_9b_says_about_the_rows(rm):
    m = load("finetune-cpu", rm)
    f = json.loads((RESULTS / "frozen-cpu" / SETTINGS[rm] / "metrics.json").read_text())
    r = {key: row(m, key) for key in ROWS}
    r["frozen_truncated"], r["frozen_windows"] = frozen_row(f, "truncated"), frozen_row(f, "windows")
    for split in ("accuracy", "val_accuracy"):
        gain = r["frozen_windows"][split] - r["frozen_truncated"][split]
        if rm:  # without headers most posts fit one window: whole posts change the frozen score little
            assert abs(gain) < 0.01
        else:  # as distributed they help the frozen vectors a lot
            assert gain > 0.05
        assert r["model"][split] > max(r["frozen_windows"][split], r["frozen_truncated"][split])  # all the data
        # lets fine-tuning beat every frozen probe
        assert r["model"][split] > r["model_truncated"][split]  # whole posts beat truncation, same weights
        assert r["model"][split] < r["tfidf_svc"][split]  # alone, fine-tuning loses to TF-IDF + LinearSVC
    assert r["ensemble"]["accuracy"] > max(r[k]["accuracy"] for k in r if k != "ensemble")
    assert all(r[k]["features"] == "words+chars" for k in ("tfidf_svc", "tfidf_logreg"))  # validation's choice
    e = r["ensemble"]  # its TF-IDF half: the baseline whose ensemble validates best
    assert e["tfidf"] == max(e["val_accuracy_with"], key=lambda k: e["val_accuracy_with"][k]["accuracy"]) == "svc"
    assert max(r, key=lambda key: r[key]["val_accuracy"]) == "ensemble"  # what validation would pick
    assert 0.0 < r["tfidf_svc"]["temperature"] < 1.0


def test_the_ensemble_per_group():
    m = load("finetune-cpu", False)
    f1 = [(m["per_class_f1"][n], m["baselines"]["tfidf_svc"]["per_class_f1"][n],
           m["baselines"]["ensemble"]["per_class_f1"][n]) for n in m["per_class_f1"]]
    better = sum(e >= max(a, b) for a, b, e in f1)
    assert better > len(f1) / 2 and all(e >= min(a, b) for a, b, e in f1)


@pytest.mark.parametrize("rm", SETTINGS, ids=SETTINGS.get)
def test_the_most_confused_pairs(rm):
    m = load("finetune-cpu", rm)
    names = list(m["per_class_f1"])
    cm = np.array(m["confusion_matrix"])
    both = np.triu(cm + cm.T, 1)  # errors between a and b, either way
    top = np.dstack(np.unravel_index(np.argsort(-both, axis=None)[:4], both.shape))[0]
    assert {frozenset((names[a], names[b])) for a, b in top} == {
        *(frozenset((g, h)) for i, g in enumerate(RELIGION) for h in RELIGION[i + 1:]),
        frozenset(("talk.politics.guns", "talk.politics.misc"))}


def test_the_second_seed():
    one, zero = load("finetune-cpu-seed1", False), load("finetune-cpu", False)
    assert (one["seed"], zero["seed"]) == (1, 0) and one["data_seed"] == zero["data_seed"]
    assert one["segments"] == 1  # one uninterrupted run
    e = one["baselines"]["ensemble"]
    assert e["tfidf"] == "svc" and e["accuracy"] > one["baselines"]["tfidf_svc"]["accuracy"]


@pytest.mark.parametrize("rm", list(SETTINGS))
def test_gpu_runs_store_the_predictions_they_scored(rm):
    """results/finetune-gpu (the full profile on one GPU): the per-post predictions give back the accuracy, the model
    is named, not a path, and both settings classify the same test posts (chapter 9b's paired interval)."""
    m, other = load("finetune-gpu", rm), load("finetune-gpu", not rm)
    pred = m["test_predictions"]
    assert len(pred["index"]) == len(pred["labels"]) == len(pred["model"]) == m["test_size"] == SPLIT_SIZES["test"]
    assert np.mean(np.asarray(pred["model"]) == np.asarray(pred["labels"])) == pytest.approx(m["accuracy"], abs=1e-12)
    assert "/" not in m["model"] and m["profile"] == "full" and m["remove_headers"] is rm
    assert pred["index"] == other["test_predictions"]["index"] and pred["labels"] == other["test_predictions"]["labels"]
