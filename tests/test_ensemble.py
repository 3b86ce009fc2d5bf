"""TF-IDF baselines, the ensemble and the error analysis of ``metrics.json`` (``bertlib.evaluation.ensemble``, chapter
9), and training on windows: every choice is made on validation, the reported numbers are what the predictions give."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bertlib.data import newsgroups
from bertlib.data import windows as win
from bertlib.evaluation import ensemble as ens
from bertlib.evaluation import inference
from bertlib.training import checkpoint, distributed
from bertlib.training import finetune as ft
from bertlib.training.finetune_config import profile_config

WORDS = {0: "hockey puck goal skate ice rink team season", 1: "disk drive scsi controller card bus jumper bios",
         2: "god church faith bible belief prayer sin soul"}


def _texts(n: int, seed: int, noise: float = 0.5) -> tuple[list[str], np.ndarray]:
    """Posts of a few words from their class's vocabulary, mixed with words of the other classes."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, n)
    vocab = {k: v.split() for k, v in WORDS.items()}
    texts = []
    for y in labels:
        words = [rng.choice(vocab[y if rng.random() > noise else rng.integers(0, 3)]) for _ in range(6)]
        texts.append(" ".join(words))
    return texts, labels


def test_choose_weight_maximises_validation_accuracy_ties_to_an_even_average():
    y = np.array([0, 1, 2, 0])
    one_hot = np.eye(3)[y]
    wrong = np.eye(3)[(y + 1) % 3]
    # BERT right on the first three posts, TF-IDF only on the last: weights above 0.5 let BERT decide everywhere
    p_bert = np.where(np.arange(4)[:, None] < 3, 0.9 * one_hot + 0.05, 0.6 * wrong + 0.2)
    p_tfidf = np.where(np.arange(4)[:, None] < 3, 0.5 * wrong + 0.25, 0.9 * one_hot + 0.05)
    w, acc = ens.choose_weight(p_bert, p_tfidf, y)
    accs = {g: np.mean((g * p_bert + (1 - g) * p_tfidf).argmax(-1) == y) for g in ens.WEIGHT_GRID}
    assert acc == max(accs.values()) and accs[w] == acc
    best = [g for g, a in accs.items() if a == acc]
    assert w == min(best, key=lambda g: abs(g - 0.5))
    w_same, _ = ens.choose_weight(one_hot, one_hot, y)  # every weight ties: the even average
    assert w_same == 0.5
    with pytest.raises(ValueError, match="same .posts, classes. shape"):
        ens.choose_weight(p_bert, p_tfidf[:3], y)


def test_tfidf_features_and_C_are_chosen_on_validation_only():
    train, y_train = _texts(120, 0)
    val, y_val = _texts(60, 1)
    grid = (0.01, 1.0, 100.0)
    model = ens.fit_tfidf(train, y_train, val, y_val, "logreg", grid)
    from sklearn.linear_model import LogisticRegression

    accs = {}
    for features in ens.FEATURES:
        vec = ens.tfidf_vectorizer(features).fit(train)
        for C in grid:
            accs[features, C] = np.mean(LogisticRegression(C=C, tol=1e-3, max_iter=1000)
                                        .fit(vec.transform(train), y_train).predict(vec.transform(val)) == y_val)
    assert (model.features, model.C) == max(accs, key=accs.get) and model.val_accuracy == max(accs.values())
    words = ens.fit_tfidf(train, y_train, val, y_val, "logreg", grid, features=("words",))
    assert words.features == "words" and words.vectorizer.get_feature_names_out()[0].isalpha()
    p = ens.tfidf_probabilities(model, val)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="must be 'logreg' or 'svc'"):
        ens.fit_tfidf(train, y_train, val, y_val, "forest")
    with pytest.raises(ValueError, match="same length"):
        ens.fit_tfidf(train, y_train[:-1], val, y_val)
    with pytest.raises(ValueError, match="features must be one of"):
        ens.tfidf_vectorizer("bigrams")


def test_svc_probabilities_use_the_temperature_that_fits_validation_best():
    train, y_train = _texts(120, 0)
    val, y_val = _texts(60, 1)
    svc = ens.fit_tfidf(train, y_train, val, y_val, "svc")
    assert svc.C in ens.C_GRID["svc"] and svc.features in ens.FEATURES
    margins = svc.decision(val)

    def val_loss(t: float) -> float:
        return float(torch.nn.functional.cross_entropy(torch.as_tensor(margins / t), torch.as_tensor(y_val)))

    # the fitted temperature beats every other one on a grid around it (its cross-entropy is the least)
    assert all(val_loss(svc.temperature) <= val_loss(svc.temperature * f) + 1e-9 for f in (0.5, 0.8, 0.95, 1.05, 2))
    p = ens.tfidf_probabilities(svc, val)
    np.testing.assert_allclose(p, ens.softmax(margins / svc.temperature), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(p.argmax(-1), svc.predict(val))  # scaling keeps every post's answer
    svc.temperature = None
    with pytest.raises(ValueError, match="has no temperature"):
        ens.tfidf_probabilities(svc, val)
    with pytest.raises(ValueError, match="one label per post"):
        ens.fit_temperature(margins, y_val[:-1])


def test_ensemble_report_scores_what_its_predictions_give():
    train, y_train = _texts(150, 2)
    val, y_val = _texts(60, 3)
    test, y_test = _texts(90, 4)
    g = torch.Generator().manual_seed(0)
    # a "BERT" that is right 70% of the time, confidently
    bert_val = torch.randn(len(val), 3, generator=g) + 3 * torch.nn.functional.one_hot(torch.as_tensor(y_val), 3)
    bert_test = torch.randn(len(test), 3, generator=g) + 3 * torch.nn.functional.one_hot(torch.as_tensor(y_test), 3)
    data = newsgroups.NewsData(*(newsgroups.Split(texts, labels, np.arange(len(texts)))
                                 for texts, labels in ((train, y_train), (val, y_val), (test, y_test))),
                               ["a", "b", "c"])
    report, preds = ens.ensemble_report(data, bert_val, bert_test, say=lambda *a: None)
    assert set(report) == set(preds) == {"tfidf_logreg", "tfidf_svc", "ensemble"}
    members = {kind: ens.fit_tfidf(train, y_train, val, y_val, kind) for kind in ("logreg", "svc")}
    choices = {kind: ens.choose_weight(ens.softmax(bert_val), ens.tfidf_probabilities(m, val), y_val)
               for kind, m in members.items()}
    e = report["ensemble"]
    assert e["val_accuracy"] == max(a for _, a in choices.values())  # the member validation prefers
    assert (e["bert_weight"], e["val_accuracy"]) == choices[e["tfidf"]]
    assert {k: (v["bert_weight"], v["accuracy"]) for k, v in e["val_accuracy_with"].items()} == choices
    w, member = e["bert_weight"], members[e["tfidf"]]
    expected = (w * ens.softmax(bert_test) + (1 - w) * ens.tfidf_probabilities(member, test)).argmax(-1)
    np.testing.assert_array_equal(preds["ensemble"], expected)
    assert report["tfidf_svc"]["temperature"] == members["svc"].temperature
    for name, pred in preds.items():
        assert report[name]["accuracy"] == float(np.mean(pred == y_test)), name


def test_accuracy_by_length_bins_every_post_once():
    lengths = np.array([5, 125, 126, 300, 600, 5000, 40])
    labels = np.array([0, 1, 1, 0, 2, 2, 1])
    preds = {"model": np.array([0, 1, 0, 0, 2, 1, 1]), "other": labels}
    rows = ens.accuracy_by_length(lengths, labels, preds)
    assert [r["tokens"] for r in rows] == ["0-125", "126-253", "254-509", "510-1021", ">=1022"]
    assert [r["posts"] for r in rows] == [3, 1, 1, 1, 1]
    assert [r["model"] for r in rows] == [1.0, 0.0, 1.0, 1.0, 0.0] and all(r["other"] == 1.0 for r in rows)
    total = sum(r["posts"] * r["model"] for r in rows) / len(labels)
    assert total == pytest.approx(np.mean(preds["model"] == labels), abs=1e-12)


def _generated(n: int = 60):
    texts = [" ".join(f"post {i} word {j}" for j in range(1 + i % 15)) for i in range(n)]
    return texts, np.arange(n) % 4, ["c0", "c1", "c2", "c3"]


def test_train_windows_trains_on_every_window_with_its_posts_label(tiny_pretrained, tmp_path):
    pretrained = tiny_pretrained
    texts, labels, names = _generated()
    cfg = profile_config("quick", train_size=None, test_size=None, max_length=16, epochs=1, batch_size=8,
                            dropout=0.0, device="cpu", train_windows=True, window_stride=4, eval_windows=False)
    data = newsgroups.split_data(texts, labels, texts[:20], labels[:20], names, cfg)
    run = ft._setup(cfg, tmp_path / "setup", torch.device("cpu"), distributed.Distributed(), 0.0, pretrained, data,
                    verbose=False)
    windows, post_index = win.encode_windows(pretrained.tokenizer, data.train.texts, 16, 4)
    assert run.seqs["train"] == windows and len(windows) > len(data.train)
    np.testing.assert_array_equal(run.train_labels, data.train.labels[post_index])
    # evaluation: truncated
    assert run.seqs["val"] == newsgroups.encode(pretrained.tokenizer, data.val.texts, 16, cfg.truncation)
    result = ft.train(cfg, tmp_path / "run", data=data, pretrained=pretrained, export=False, verbose=False)
    assert result.metrics["train_windows"] == len(windows)
    assert result.metrics["train_tokens"] == sum(len(w) for w in windows)  # one epoch: every window once


def test_metrics_hold_the_error_analysis_and_the_ensemble(tiny_pretrained, tmp_path):
    pretrained = tiny_pretrained
    texts, labels, names = _generated()
    cfg = profile_config("quick", train_size=None, test_size=None, max_length=16, max_steps=2, batch_size=8,
                            device="cpu", eval_windows=True, window_stride=4, tfidf_ensemble=True)
    data = newsgroups.split_data(texts, labels, texts[:24], labels[:24], names, cfg)
    m = ft.train(cfg, tmp_path, data=data, pretrained=pretrained, export=False, verbose=False).metrics
    cm = np.array(m["confusion_matrix"])
    assert cm.shape == (4, 4) and cm.sum() == 24 and np.trace(cm) / 24 == pytest.approx(m["accuracy"], abs=1e-12)
    assert sum(r["posts"] for r in m["accuracy_by_length"]) == 24
    assert set(m["baselines"]) == {"tfidf_logreg", "tfidf_svc", "ensemble"} and m["tfidf_ensemble"]
    for name in ("model", "ensemble", "tfidf_svc"):
        overall = m["accuracy"] if name == "model" else m["baselines"][name]["accuracy"]
        by_length = sum(r["posts"] * r[name] for r in m["accuracy_by_length"]) / 24
        assert by_length == pytest.approx(overall, abs=1e-12), name
    assert 0.0 <= m["baselines"]["ensemble"]["bert_weight"] <= 1.0
    # the same best weights on head+tail-truncated posts, beside the windows
    model = ft.build_model(cfg, pretrained, 4, torch.device("cpu"))
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(tmp_path / checkpoint.BEST)))
    cut = newsgroups.encode(pretrained.tokenizer, data.test.texts, 16, cfg.truncation)
    expected, _ = inference.evaluate(model, cut, data.test.labels, names, pretrained.tokenizer.pad_token_id,
                                     options=inference.PredictOptions(device="cpu"))
    assert m["truncated"]["accuracy"] == expected["accuracy"] and "val_accuracy" in m["truncated"]
    by_length = sum(r["posts"] * r["model_truncated"] for r in m["accuracy_by_length"]) / 24
    assert by_length == pytest.approx(expected["accuracy"], abs=1e-12)
