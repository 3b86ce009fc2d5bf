"""Classifiers over a post's window vectors (chapter 9, *whole posts* and *attention over windows*): the windows of
:mod:`bertlib.data.windows` each give a vector; :class:`WindowClassifier` pools a post's vectors (mean, max, or
learned attention, :class:`WindowAttention`) and scores the post with one linear layer; :func:`fit_window_classifier`
chooses its weight decay on the validation posts.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from bertlib.data.windows import pool_windows
from bertlib.evaluation.inference import best_on_validation
from bertlib.model.runtime import seeded


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
    (:mod:`bertlib.training.finetune`) pools logits by mean or max instead."""

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
