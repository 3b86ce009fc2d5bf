"""Whole posts: classify a post from all of its tokens with overlapping windows (chapter 9, *whole posts*).

A post longer than ``max_length`` loses its middle under head+tail truncation
(:func:`bertlib.data.newsgroups.truncate`). Here it is cut instead into windows of at most ``max_length - 2``
body tokens, each wrapped ``[CLS] ... [SEP]``, consecutive windows sharing ``stride`` tokens: Hugging Face's fast
tokenizers do the same with
``tokenizer(text, truncation=True, max_length=..., stride=..., return_overflowing_tokens=True)``, and
:func:`split_windows` gives exactly their windows (``tests/test_windows.py``). The model scores every window; the
windows' logits are combined per post (:func:`pool_windows`: mean or max). The pieces, in order:
:func:`split_windows`, :func:`encode_windows`, then :func:`bertlib.evaluation.inference.predict_post_logits` (the
model's window logits, pooled here). Learned pooling of the windows' vectors:
:mod:`bertlib.evaluation.window_classifier`.

A post's prediction does not depend on how its windows are batched nor on where the post stands among the others,
up to float rounding of differently padded batches (``bertlib.tolerance``).
"""

from __future__ import annotations

import numpy as np
import torch

from bertlib.data.corpus import body_ids

__all__ = ["POOLINGS", "check_windows", "encode_windows", "pool_windows", "split_windows"]


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


#: How :func:`pool_windows` combines a post's window logits: the name → ``Tensor.scatter_reduce``'s ``reduce``.
POOLINGS: dict[str, str] = {"mean": "mean", "max": "amax"}


def pool_windows(window_logits: torch.Tensor, post_index: torch.Tensor, n_posts: int, how: str = "mean"
                 ) -> torch.Tensor:
    """``(windows, labels)`` logits → ``(posts, labels)``: each post's windows combined by ``how``.

    ``"mean"``: the average of the post's window logits; ``"max"``: their elementwise maximum (each class scored by
    the window that speaks most for it). ``post_index``: ``(windows,)``, the post of each window, every post in
    ``range(n_posts)`` having at least one. One ``Tensor.scatter_reduce`` (differentiable, on any device; not
    ``index_reduce``, which warns that it is in beta)."""
    if how not in POOLINGS:
        raise ValueError(f"window pooling must be one of {sorted(POOLINGS)}, got {how!r}.")
    post_index = torch.as_tensor(post_index, dtype=torch.long, device=window_logits.device)
    if window_logits.dim() != 2 or post_index.shape != window_logits.shape[:1]:
        raise ValueError(f"window_logits must be (windows, labels) and post_index (windows,), got "
                         f"{tuple(window_logits.shape)} and {tuple(post_index.shape)}.")
    counts = torch.bincount(post_index, minlength=n_posts)
    if len(counts) != n_posts or (counts == 0).any():
        raise ValueError(f"post_index must give every post in range({n_posts}) at least one window, and no other "
                         "post: build both with encode_windows.")
    out = window_logits.new_zeros(n_posts, window_logits.shape[1])
    rows = post_index[:, None].expand_as(window_logits)  # (windows, labels): window w's row goes to post_index[w]
    return out.scatter_reduce(0, rows, window_logits, POOLINGS[how], include_self=False)
