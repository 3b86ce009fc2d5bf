"""Whole posts: classify a post from all of its tokens with overlapping windows (chapter 9, *whole posts*).

A post longer than ``max_length`` loses its middle under head+tail truncation (:func:`bertlib.newsgroups.truncate`).
Here it is cut instead into windows of at most ``max_length - 2`` body tokens, each wrapped ``[CLS] ... [SEP]``,
consecutive windows sharing ``stride`` tokens: Hugging Face's fast tokenizers do the same with
``tokenizer(text, truncation=True, max_length=..., stride=..., return_overflowing_tokens=True)``, and
:func:`split_windows` gives exactly their windows (``tests/test_windows.py``). The model scores every window; the
windows' logits are combined per post (:func:`pool_windows`: mean or max). The pieces, in order:
:func:`split_windows`, :func:`encode_windows`, then :func:`~bertlib.inference.pool_windows` and
:func:`~bertlib.inference.predict_post_logits` (inference, from :mod:`bertlib.inference`; re-exported here).
:class:`WindowAttention` pools the windows' vectors instead, with learned weights: :func:`fit_window_classifier`
trains it, or a mean or max pooling, with a linear layer on fixed window vectors (chapter 9 compares the three on
the frozen network's vectors; fine-tuning pools logits by mean or max).

A post's prediction does not depend on how its windows are batched nor on where the post stands among the others,
up to float rounding of differently padded batches (``bertlib.tolerance``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .data import body_ids
from .inference import POOLINGS, best_on_validation, pool_windows, predict_post_logits
from .runtime import seeded

__all__ = ["POOLINGS", "VECTOR_POOLINGS", "WindowAttention", "WindowClassifier", "check_windows", "encode_windows",
           "fit_window_classifier", "pool_windows", "predict_post_logits", "predict_windows", "segment_softmax",
           "split_windows"]


def check_windows(max_length: int, stride: int) -> None:
    """Raise ``ValueError`` unless ``[CLS] window [SEP]`` fits ``max_length`` with room for at least one body token
    and consecutive windows can advance: ``0 <= stride < max_length - 2`` (Hugging Face's tokenizers refuse a
    ``stride`` that is not strictly less than the window's room, too)."""
    if max_length < 3:
        raise ValueError(f"max_length must be at least 3 ([CLS], one token, [SEP]), got {max_length}.")
    room = max_length - 2
    if not 0 <= stride < room:
        raise ValueError(f"stride (tokens shared by consecutive windows) must be in [0, max_length - 2 = {room}), got "
                         f"{stride}: a window must advance by at least one token. Lower --window-stride or raise "
                         "--max-length.")


def split_windows(body: list[int], max_length: int, stride: int, cls_id: int, sep_id: int) -> list[list[int]]:
    """``body`` (a post's token ids, no special tokens) → windows ``[CLS] body[s : s + room] [SEP]``.

    ``room = max_length - 2`` body tokens per window; the windows start at ``s = 0, step, 2 step, ...`` with
    ``step = room - stride`` and stop at the first one that reaches the body's end (it may be shorter than
    ``room``). So every token is in at least one window and consecutive windows share exactly ``stride`` tokens:
    what Hugging Face's tokenizers return with ``return_overflowing_tokens=True, stride=stride``. A body of at most
    ``room`` tokens gives one window, ``truncate(body, max_length, "head", ...)``; an empty body ``[[CLS, SEP]]``.
    """
    check_windows(max_length, stride)
    room, step = max_length - 2, max_length - 2 - stride
    windows, start = [], 0
    while True:
        windows.append([cls_id, *body[start:start + room], sep_id])
        if start + room >= len(body):
            return windows
        start += step


def encode_windows(tokenizer, texts: list[str], max_length: int, stride: int) -> tuple[list[list[int]], np.ndarray]:
    """Every window (:func:`split_windows`) of every post, flattened in post order, and ``post_index``, the
    ``(windows,)`` array of the post each comes from (Hugging Face's ``overflow_to_sample_mapping``)."""
    check_windows(max_length, stride)
    per_post = [split_windows(ids, max_length, stride, tokenizer.cls_token_id, tokenizer.sep_token_id)
                for ids in body_ids(tokenizer, texts)]
    windows = [w for post in per_post for w in post]
    post_index = np.repeat(np.arange(len(per_post)), [len(post) for post in per_post])
    return windows, post_index


def segment_softmax(scores: torch.Tensor, post_index: torch.Tensor, n_posts: int) -> torch.Tensor:
    """``(windows,)`` scores → ``(windows,)`` weights: a softmax over each post's windows,
    ``a_w = exp(s_w - m_p) / sum_{v in p} exp(s_v - m_p)`` with ``m_p`` the post's largest score (for stability)."""
    top = scores.new_full((n_posts,), float("-inf")).scatter_reduce(0, post_index, scores, "amax", include_self=False)
    e = torch.exp(scores - top[post_index])
    return e / e.new_zeros(n_posts).index_add(0, post_index, e)[post_index]


class WindowAttention(nn.Module):
    """Attention over a post's windows: ``(windows, hidden)`` pooled ``[CLS]`` vectors ``h_w`` → ``(posts, hidden)``
    vectors ``sum_w a_w h_w``, with ``a`` the :func:`segment_softmax` of the learned scores ``s_w = u · h_w``.

    ``u`` starts at zero, so an untrained module is the mean of the windows' vectors; a classifier layer on its
    output then scores the post (:class:`WindowClassifier`). Chapter 9, *whole posts*; fine-tuning
    (:mod:`bertlib.finetune`) pools logits by mean or max instead."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.score = nn.Linear(hidden_size, 1, bias=False)
        nn.init.zeros_(self.score.weight)

    def forward(self, pooled: torch.Tensor, post_index: torch.Tensor, n_posts: int) -> torch.Tensor:
        post_index = torch.as_tensor(post_index, dtype=torch.long, device=pooled.device)
        weights = segment_softmax(self.score(pooled).squeeze(-1), post_index, n_posts)  # (windows,)
        return pooled.new_zeros(n_posts, pooled.shape[-1]).index_add(0, post_index, weights[:, None] * pooled)


#: The poolings :class:`WindowClassifier` offers: of window vectors, before its linear layer.
VECTOR_POOLINGS: tuple[str, ...] = ("mean", "max", "attention")


class WindowClassifier(nn.Module):
    """``(windows, hidden)`` window vectors → ``(posts, labels)`` logits: each post's windows pooled by ``pool``
    (``"mean"``, ``"max"``: :func:`pool_windows`; ``"attention"``: :class:`WindowAttention`), then one linear
    layer. Chapter 9, *attention over windows*."""

    def __init__(self, hidden_size: int, num_labels: int, pool: str = "mean") -> None:
        super().__init__()
        if pool not in VECTOR_POOLINGS:
            raise ValueError(f"pool must be one of {VECTOR_POOLINGS}, got {pool!r}.")
        self.pool = pool
        self.attention = WindowAttention(hidden_size) if pool == "attention" else None
        self.classifier = nn.Linear(hidden_size, num_labels)

    def forward(self, vectors: torch.Tensor, post_index, n_posts: int) -> torch.Tensor:
        post_index = torch.as_tensor(post_index, dtype=torch.long, device=vectors.device)
        if self.attention is not None:
            pooled = self.attention(vectors, post_index, n_posts)
        else:
            pooled = pool_windows(vectors, post_index, n_posts, self.pool)
        return self.classifier(pooled)  # (posts, labels)


def fit_window_classifier(train: tuple, val: tuple, num_labels: int, pool: str = "mean",
                          weight_decays: tuple[float, ...] = (1e-3, 1e-2, 1e-1), steps: int = 300,
                          lr: float = 1e-2, seed: int | None = None) -> tuple[WindowClassifier, float, float]:
    """Train a :class:`WindowClassifier` on fixed window vectors; return it, the weight decay validation chose and
    its validation accuracy. ``train`` and ``val``: ``(vectors (windows, hidden), post_index (windows,), labels
    (posts,))``. The vectors are standardised with the training windows' mean and standard deviation (kept in the
    returned model's ``scale``); full-batch AdamW, ``steps`` steps at ``lr``, cross-entropy over the posts, one
    run per weight decay from the same initialisation (``seed``, drawn without touching the global generator)."""
    vectors, post_index, labels = (torch.as_tensor(np.asarray(x)) for x in train)
    shift, spread = vectors.mean(0), vectors.std(0) + 1e-6

    def fitted():
        for wd in weight_decays:
            with seeded(seed):  # the same start for every weight decay; the caller's generator untouched
                model = WindowClassifier(vectors.shape[1], num_labels, pool)
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
            for _ in range(steps):
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model((vectors - shift) / spread, post_index, len(labels)),
                                                   labels)
                loss.backward()
                opt.step()
            model.scale = (shift, spread)
            pred = predict_windows(model, *val[:2], len(val[2])).argmax(-1).numpy()
            yield (model.eval(), wd), float((pred == np.asarray(val[2])).mean())

    (model, wd), acc = best_on_validation(fitted())
    return model, wd, acc


@torch.no_grad()
def predict_windows(model: WindowClassifier, vectors, post_index, n_posts: int) -> torch.Tensor:
    """``(n_posts, labels)`` logits of a fitted :class:`WindowClassifier` (standardised as in training)."""
    shift, spread = model.scale
    return model((torch.as_tensor(np.asarray(vectors)) - shift) / spread, post_index, n_posts)
