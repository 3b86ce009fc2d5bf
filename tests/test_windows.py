"""Whole posts by sliding windows (``bertlib.data.windows``, chapter 9): the windows are Hugging Face's overflowing
tokens, cover every token, and a post's pooled prediction depends neither on batching nor on the order of posts.

The model is the tiny random BERT of tests/conftest.py (the embedded model's tokenizer) with a 4-class head (seed
0): the checks hold for any weights. Windows are kept short (32 tokens) so that a few posts give many windows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bertlib
import bertlib.data.corpus
import bertlib.tasks.classifier
from bertlib.data import newsgroups
from bertlib.data import windows as win
from bertlib.evaluation import inference, window_classifier
from bertlib.training import finetune as ft
from bertlib.training import finetune_config
from bertlib.training.finetune_config import profile_config
from helpers import DEVICE, data_available, needs_data

CLS, SEP = 101, 102

#: Predictions on the test device, in batches of 64 (:class:`inference.PredictOptions`)
ON_DEVICE = inference.PredictOptions(device=DEVICE)


def batches(size: int) -> inference.PredictOptions:
    """Predictions on the test device in batches of ``size``."""
    return inference.PredictOptions(batch_size=size, device=DEVICE)


#: Texts of 0 to ~150 tokens, plain and varied (no repeated stretch, so a window's place in the body is unambiguous).
TEXTS = ["", "A short post.", "Does anyone know where to find the drivers for a Diamond Stealth card under OS/2?",
         " ".join(f"item {i} costs {3 * i + 7} dollars" for i in range(25)),
         " ".join(str(n) for n in range(1000, 1100))]


@pytest.fixture(scope="module")
def model(tiny_pretrained) -> bertlib.tasks.classifier.BertClassifier:
    return bertlib.tasks.classifier.BertClassifier(tiny_pretrained.state_dict, tiny_pretrained.config, 4, seed=0,
                                  attn_implementation="sdpa").to(DEVICE).eval()


@pytest.fixture(scope="module")
def posts() -> list[str]:
    """Six real test posts, headers included, of 100 to 600 tokens; the generated TEXTS without the data."""
    if not data_available():
        return TEXTS[1:]
    texts = bertlib.data.corpus.load_20newsgroups("test").data
    lengths = np.array([len(t.split()) for t in texts[:300]])
    chosen = [i for i in np.argsort(lengths) if 60 <= lengths[i] <= 400]
    return [texts[i] for i in chosen[:: max(1, len(chosen) // 6)][:6]]


def _start(window: list[int], body: list[int]) -> int:
    """Where ``window``'s body tokens start in ``body`` (they must be a contiguous stretch of it)."""
    inner = window[1:-1]
    return next(s for s in range(len(body) - len(inner) + 1) if body[s:s + len(inner)] == inner)


@pytest.mark.parametrize(("max_length", "stride"), [(3, 0), (8, 0), (8, 5), (16, 4), (32, 8), (20, 17)])
def test_windows_cover_every_token_and_overlap_by_stride(max_length, stride):
    room = max_length - 2
    for n in [0, 1, room - 1, room, room + 1, 2 * room - stride, 2 * room - stride + 1, 97]:
        body = list(range(1000, 1000 + n))
        windows = win.split_windows(body, max_length, stride, CLS, SEP)
        assert all(w[0] == CLS and w[-1] == SEP and len(w) <= max_length for w in windows)
        starts = [_start(w, body) for w in windows]
        covered = sorted({t for w in windows for t in w[1:-1]})
        assert covered == body, f"n={n}: tokens missing from the windows"
        assert starts[0] == 0 and starts[-1] + len(windows[-1]) - 2 == n  # the last window ends at the body's end
        for a, b, w in zip(starts, starts[1:], windows, strict=False):
            assert len(w) == max_length and a + room - b == stride, f"n={n}: overlap {a + room - b} != {stride}"
        assert len(windows) == 1 + max(0, -(-(n - room) // (room - stride)))  # ceil((n - room) / step) more
    assert win.split_windows([], 16, 4, CLS, SEP) == [[CLS, SEP]]


def _hf_windows(tokenizer, texts, max_length, stride):
    enc = tokenizer(texts, truncation=True, max_length=max_length, stride=stride, return_overflowing_tokens=True)
    return enc["input_ids"], np.asarray(enc["overflow_to_sample_mapping"])


@pytest.mark.parametrize(("max_length", "stride"), [(16, 0), (16, 4), (32, 8), (40, 3), (64, 61)])
def test_windows_are_hugging_faces_overflowing_tokens(pretrained, max_length, stride):
    windows, post_index = win.encode_windows(pretrained.tokenizer, TEXTS, max_length, stride)
    hf, hf_index = _hf_windows(pretrained.tokenizer, TEXTS, max_length, stride)
    assert windows == hf and np.array_equal(post_index, hf_index)


@needs_data
def test_windows_of_real_posts_are_hugging_faces(pretrained, posts):
    for max_length, stride in [(128, 32), (512, 128), (512, 0)]:
        windows, post_index = win.encode_windows(pretrained.tokenizer, posts, max_length, stride)
        hf, hf_index = _hf_windows(pretrained.tokenizer, posts, max_length, stride)
        assert windows == hf and np.array_equal(post_index, hf_index), (max_length, stride)
        assert post_index.max() == len(posts) - 1
        if max_length == 128:
            assert len(windows) > len(posts), "some post should need two windows"


def test_bad_settings_are_named(pretrained):
    with pytest.raises(ValueError, match="max_length must be at least 3"):
        win.split_windows([1, 2], 2, 0, CLS, SEP)
    for stride in (-1, 14, 20):
        with pytest.raises(ValueError, match=r"stride .* must be in \[0, max_length - 2 = 14\)"):
            win.encode_windows(pretrained.tokenizer, TEXTS, 16, stride)
    logits, index = torch.zeros(3, 2), torch.tensor([0, 0, 1])
    with pytest.raises(ValueError, match="window pooling must be one of"):
        win.pool_windows(logits, index, 2, "median")
    with pytest.raises(ValueError, match="at least one window"):
        win.pool_windows(logits, index, 3, "mean")  # post 2 has none
    with pytest.raises(ValueError, match="and no other post"):
        win.pool_windows(logits, torch.tensor([0, 1, 2]), 2, "mean")
    with pytest.raises(ValueError, match=r"\(windows, labels\)"):
        win.pool_windows(logits, index[:2], 2, "mean")


def test_pooling_is_the_mean_or_max_of_each_posts_windows():
    g = torch.Generator().manual_seed(0)
    post_index = torch.tensor([2, 0, 0, 1, 2, 2, 0, 3])  # windows in any order
    logits = torch.randn(len(post_index), 5, generator=g, dtype=torch.float64)
    for how, reduce in [("mean", lambda rows: [sum(c) / len(c) for c in zip(*rows, strict=True)]),
                        ("max", lambda rows: [max(c) for c in zip(*rows, strict=True)])]:
        expected = [reduce([logits[w].tolist() for w in range(len(post_index)) if post_index[w] == p])
                    for p in range(4)]
        torch.testing.assert_close(win.pool_windows(logits, post_index, 4, how),
                                   torch.tensor(expected, dtype=torch.float64), atol=1e-12, rtol=0)
    leaf = logits.clone().requires_grad_()
    win.pool_windows(leaf, post_index, 4, "mean")[0].sum().backward()  # differentiable: usable in training
    torch.testing.assert_close(leaf.grad[:, 0], (post_index == 0).double() / 3)


def test_short_post_is_its_head_truncation(pretrained, model):
    tok, pad = pretrained.tokenizer, pretrained.tokenizer.pad_token_id
    short = TEXTS[:3]  # at most 30 body tokens
    windows, post_index = win.encode_windows(tok, short, 32, 8)
    assert windows == newsgroups.encode(tok, short, 32, "head") and post_index.tolist() == [0, 1, 2]
    for how in win.POOLINGS:
        pooled = inference.predict_post_logits(model, windows, post_index, len(short), pad, how, ON_DEVICE)
        cut = newsgroups.encode(tok, short, 32, "head")
        assert torch.equal(pooled, inference.predict_logits(model, cut, pad, ON_DEVICE))


@pytest.fixture(scope="module")
def one_at_a_time(pretrained, model, posts) -> torch.Tensor:
    """The logits of every window of the posts, each window scored alone (batches of one), in the tokenizer's order."""
    windows, _ = win.encode_windows(pretrained.tokenizer, posts, 32, 8)
    return torch.cat([inference.predict_logits(model, [w], pretrained.tokenizer.pad_token_id, ON_DEVICE)
                      for w in windows])


@pytest.mark.parametrize("how", sorted(win.POOLINGS))
def test_pooled_prediction_ignores_batching_and_post_order(pretrained, model, posts, one_at_a_time, how):
    tok, pad, tol = pretrained.tokenizer, pretrained.tokenizer.pad_token_id, bertlib.tolerance(DEVICE)
    windows, post_index = win.encode_windows(tok, posts, 32, 8)
    assert len(windows) >= 3 * len(posts), "the posts should need several windows each"
    by_all = inference.predict_post_logits(model, windows, post_index, len(posts), pad, how, batches(len(windows)))
    by_some = inference.predict_post_logits(model, windows, post_index, len(posts), pad, how, batches(3))
    torch.testing.assert_close(by_some, by_all, **tol)
    order = np.random.default_rng(0).permutation(len(posts))
    shuffled, shuffled_index = win.encode_windows(tok, [posts[i] for i in order], 32, 8)
    by_order = inference.predict_post_logits(model, shuffled, shuffled_index, len(posts), pad, how, batches(5))
    torch.testing.assert_close(by_order, by_all[torch.as_tensor(order)], **tol)
    assert torch.equal(by_order.argmax(-1), by_all[torch.as_tensor(order)].argmax(-1))
    # and pooling the windows scored one at a time (batches of one), in the tokenizer's order, by hand
    one_by_one = one_at_a_time
    for p in range(len(posts)):
        rows = one_by_one[torch.as_tensor(post_index == p)]
        torch.testing.assert_close(by_all[p], rows.mean(0) if how == "mean" else rows.amax(0), **tol)


# ---------------------------------------------------------- wired into bertlib.training.finetune (eval_windows)


def test_evaluate_by_windows_scores_the_pooled_posts(pretrained, model):
    tok, pad = pretrained.tokenizer, pretrained.tokenizer.pad_token_id
    labels, names = np.array([0, 1, 2, 3, 1]), ["a", "b", "c", "d"]
    windows, post_index = win.encode_windows(tok, TEXTS, 16, 4)
    for how in win.POOLINGS:
        result, logits = inference.evaluate(model, windows, labels, names, pad, post_index=post_index,
                                            window_pool=how, options=batches(8))
        assert torch.equal(logits, inference.predict_post_logits(model, windows, post_index, len(TEXTS), pad, how,
                                                                 batches(8)))
        assert result["accuracy"] == np.mean(logits.argmax(-1).numpy() == labels)
        assert result["loss"] == pytest.approx(torch.nn.functional.cross_entropy(logits, torch.as_tensor(labels))
                                               .item(), rel=1e-6)


def test_window_settings_are_checked_and_on_the_command_line():
    assert profile_config("full").window_stride == 128 and profile_config("quick").window_stride == 32
    assert profile_config("quick").eval_windows and not profile_config("full").eval_windows  # chapter 9's choice
    profile_config("quick", max_length=16, window_stride=32, eval_windows=False)  # unused without windows: no error
    with pytest.raises(ValueError, match=r"stride .* must be in \[0, max_length - 2 = 14\)"):
        profile_config("quick", max_length=16, window_stride=14, eval_windows=True)
    with pytest.raises(ValueError, match="window_pool must be one of"):
        profile_config("quick", window_pool="attention")
    cfg, _ = finetune_config.parse_args(["--profile", "quick", "--out", "x", "--eval-windows", "--window-stride", "16",
                            "--window-pool", "max"])
    assert cfg == profile_config("quick", eval_windows=True, window_stride=16, window_pool="max")


def test_train_with_eval_windows_scores_whole_posts(tiny_pretrained, tmp_path):
    """One step on generated posts of 5 to 60 tokens (16-token windows): training is the same with and without
    eval_windows (the same weights); validation and test are scored on the pooled windows."""
    texts = [" ".join(f"post {i} word {j}" for j in range(1 + i % 15)) for i in range(60)]
    labels = np.arange(60) % 4
    names = ["c0", "c1", "c2", "c3"]
    results = {}
    for windows in (False, True):
        cfg = profile_config("quick", train_size=None, test_size=None, max_length=16, max_steps=1, batch_size=8,
                                dropout=0.0, device="cpu", eval_windows=windows, window_stride=4, window_pool="max")
        data = newsgroups.split_data(texts, labels, texts[:20], labels[:20], names, cfg)
        results[windows] = ft.train(cfg, tmp_path / str(windows), data=data, pretrained=tiny_pretrained,
                                    export=False, verbose=False)
    plain, whole = results[False], results[True]
    for (name, a), b in zip(plain.model.state_dict().items(), whole.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    tok = tiny_pretrained.tokenizer
    windows, post_index = win.encode_windows(tok, texts[:20], 16, 4)
    assert whole.metrics["eval_windows"] and whole.metrics["test_windows"] == len(windows) > 20
    as_run = inference.PredictOptions(device="cpu", bf16=whole.metrics["precision"] == "bf16 autocast")
    expected = inference.predict_post_logits(whole.model, windows, post_index, 20, tok.pad_token_id, "max",
                                             as_run)  # as the run scored them
    torch.testing.assert_close(whole.test_logits, expected, atol=0, rtol=0)
    assert plain.metrics["test_windows"] is None
    assert not torch.equal(plain.test_logits, whole.test_logits), "the long posts should score differently whole"


def test_window_attention_is_a_softmax_over_each_posts_windows():
    g = torch.Generator().manual_seed(1)
    post_index = torch.tensor([1, 0, 1, 1, 2, 0])
    h = torch.randn(len(post_index), 6, generator=g, dtype=torch.float64)
    att = window_classifier.WindowAttention(6).double()
    mean = win.pool_windows(h, post_index, 3, "mean")
    torch.testing.assert_close(att(h, post_index, 3), mean, atol=1e-12, rtol=0)  # u = 0: the mean
    with torch.no_grad():
        att.score.weight.copy_(torch.randn(1, 6, generator=g, dtype=torch.float64))
    out = att(h, post_index, 3)
    for p in range(3):  # by hand: softmax of u · h over the post's windows, then the weighted sum
        rows = h[post_index == p]
        a = torch.softmax(rows @ att.score.weight[0], 0)
        torch.testing.assert_close(out[p], (a[:, None] * rows).sum(0), atol=1e-12, rtol=0)
    order = torch.randperm(len(post_index), generator=g)  # the windows' order does not matter
    torch.testing.assert_close(att(h[order], post_index[order], 3), out, atol=1e-12, rtol=0)
    out.sum().backward()
    assert att.score.weight.grad.abs().sum() > 0, "the scores must learn"
    far = window_classifier.segment_softmax(torch.tensor([1e4, -1e4, 1e4 + 1.0, 0.0]), torch.tensor([0, 1, 0, 1]), 2)
    torch.testing.assert_close(far, torch.tensor([1 / (1 + np.e), 0.0, np.e / (1 + np.e), 1.0]))  # no overflow


def _needle_posts(n_posts: int, seed: int) -> tuple[torch.Tensor, np.ndarray, np.ndarray]:
    """Posts of 6 windows: one marked window (dimension 0 = 3) carries its class (dimensions 1-3), five unmarked
    windows carry another class at random. Pooling by mean hears mostly the noise; attention can find the mark."""
    g = np.random.default_rng(seed)
    labels = g.integers(0, 3, n_posts)
    vectors, post_index = [], []
    for p, y in enumerate(labels):
        for w in range(6):
            v = 0.3 * g.normal(size=5)
            v[1 + (y if w == 0 else g.integers(0, 3))] += 1.0
            v[0] += 3.0 if w == 0 else 0.0
            vectors.append(v)
            post_index.append(p)
    return torch.tensor(np.array(vectors), dtype=torch.float32), np.array(post_index), labels


@pytest.mark.slow  # twelve fits of 200 steps each
def test_window_classifier_pools_then_classifies_and_attention_finds_the_telling_window():
    vectors, post_index, labels = _needle_posts(300, 0)
    val = _needle_posts(150, 1)
    untrained = window_classifier.WindowClassifier(5, 3, "attention")
    as_mean = window_classifier.WindowClassifier(5, 3, "mean")
    as_mean.classifier.load_state_dict(untrained.classifier.state_dict())
    torch.testing.assert_close(untrained(vectors, post_index, 300), as_mean(vectors, post_index, 300))  # u = 0
    state = torch.random.get_rng_state()
    fits = {pool: window_classifier.fit_window_classifier((vectors, post_index, labels), val, 3, pool, steps=200)
            for pool in window_classifier.VECTOR_POOLINGS}
    assert torch.equal(torch.random.get_rng_state(), state)   # the caller's generator is left as it was
    test = _needle_posts(300, 2)
    acc = {pool: float((window_classifier.predict_windows(m, *test[:2], 300).argmax(-1).numpy() == test[2]).mean())
           for pool, (m, wd, val_acc) in fits.items()}
    # over 6 draws of data and initialisation: attention 0.91-0.99, mean 0.50-0.58, max 0.41-0.48
    assert acc["attention"] > 0.8 and acc["attention"] > max(acc["mean"], acc["max"]) + 0.2, acc
    model, wd, val_acc = fits["mean"]   # the weight decay is validation's choice among the grid
    again = {d: window_classifier.fit_window_classifier((vectors, post_index, labels), val, 3, "mean", (d,),
                                                        steps=200)[2] for d in (1e-3, 1e-2, 1e-1)}
    assert wd in again and val_acc == max(again.values()) == again[wd]
    with pytest.raises(ValueError, match="pool must be one of"):
        window_classifier.WindowClassifier(5, 3, "median")
