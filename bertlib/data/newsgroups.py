"""The 20 Newsgroups task of chapter 9: the posts of a run and how they become token ids.

:func:`load_data` draws a run's training, validation and test posts (:class:`NewsData`) as a pure function of its
:class:`Selection`'s ``data_seed``: stratified subsets, and a stratified validation split held out of the training posts
(:func:`split_data`). :func:`encode` turns a post into ``[CLS] ... [SEP]`` ids of at most ``max_length``, keeping
its head and tail (:func:`truncate`, Sun et al. 2019); whole posts in windows are :mod:`bertlib.data.windows`.
:data:`POSTS` says which posts each profile reads; fine-tuning and the frozen-features command start from it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bertlib.data.corpus import body_ids, check_sizes, load_20newsgroups

#: What ``--remove-headers`` removes: scikit-learn's ``remove=`` argument.
REMOVE = ("headers", "footers", "quotes")

#: The share of the training posts held out (stratified) for validation (the quick profile holds out more).
VAL_FRACTION = 0.1

#: The posts each profile reads: how many training posts are drawn and which share of them validates (None: all
#: 11,314), how many test posts (None: all 7,532), how many tokens each and which (the first, or head+tail), and how
#: many tokens consecutive windows share. ``quick``: CPU in minutes (CI): 400 posts drawn, half (200) held out so
#: that validation can choose (one post is half a point), 200 trained on (10 per class), read at their first 128
#: tokens (headers included; chosen on validation: :data:`bertlib.training.finetune_config.PROFILES`, chapter 9),
#: 400 test posts; ``cpu``: all posts
#: on 2 CPU cores in 128-token windows; ``full``: a GPU, all posts, 512 tokens. The profiles of fine-tuning
#: (:data:`bertlib.training.finetune_config.PROFILES`) and of ``bertlib-features`` start from these.
POSTS: dict[str, dict] = {
    "quick": dict(train_size=400, val_fraction=0.5, test_size=400, max_length=128, truncation="head",
                  window_stride=32),
    "cpu": dict(train_size=None, val_fraction=VAL_FRACTION, test_size=None, max_length=128, truncation="head_tail",
                window_stride=0),
    "full": dict(train_size=None, val_fraction=VAL_FRACTION, test_size=None, max_length=512, truncation="head_tail",
                 window_stride=128),
}

#: The quick profile's draw before 2026-11-28 (500 posts drawn, 200 held out: 300 trained on), without windows. The
#: measurements made on it are kept comparable by reading it again: appendix 14.9's time-to-accuracy curves
#: (:mod:`bertlib.perf.bench_training`) and the engine table's classifier (:mod:`bertlib.perf.bench_engines`).
QUICK_BEFORE = dict(train_size=500, val_fraction=0.4)


@dataclass
class Split:
    """Posts and their class indices; ``index`` is each post's position in scikit-learn's split."""

    texts: list[str]
    labels: np.ndarray
    index: np.ndarray

    def __len__(self) -> int:
        return len(self.texts)


@dataclass
class NewsData:
    """The training, validation and test posts of one setting, and the 20 class names."""

    train: Split
    val: Split
    test: Split
    label_names: list[str]
    remove: tuple[str, ...] = ()


def stratified(labels: np.ndarray, size: int | None, seed: int) -> np.ndarray:
    """Indices of a stratified random subset of ``size`` (all, in order, for ``None``), sorted."""
    from sklearn.model_selection import train_test_split

    everything = np.arange(len(labels))
    if size is None or size >= len(labels):
        return everything
    keep, _ = train_test_split(everything, train_size=size, stratify=labels, random_state=seed)
    return np.sort(keep)


class Selection(Protocol):
    """Which posts a run reads: ``train_size`` training posts (None: all), of which ``val_fraction`` are held out for
    validation, and ``test_size`` test posts (None: all), every draw stratified with ``data_seed``. The settings of
    fine-tuning (:class:`bertlib.training.finetune_config.FinetuneConfig`) and of the frozen features
    (:class:`bertlib.evaluation.features.FeaturesConfig`) are selections; so is any object with these four fields."""

    train_size: int | None
    test_size: int | None
    val_fraction: float
    data_seed: int


def split_data(texts, labels, test_texts, test_labels, label_names, selection: Selection,
               remove: tuple[str, ...] = ()) -> NewsData:
    """Subsets and the validation split, as a pure function of ``selection.data_seed`` (see :func:`load_data`)."""
    from sklearn.model_selection import train_test_split

    labels, test_labels = np.asarray(labels), np.asarray(test_labels)
    n_classes = len(label_names)
    seed = selection.data_seed
    check_sizes(selection.train_size, selection.test_size, selection.val_fraction, n_classes)  # before sklearn
    chosen = stratified(labels, selection.train_size, seed)
    n_val = max(n_classes, round(selection.val_fraction * len(chosen)))  # stratifying needs one post per class
    train_idx, val_idx = train_test_split(chosen, test_size=n_val, stratify=labels[chosen], random_state=seed)
    train_idx, val_idx = np.sort(train_idx), np.sort(val_idx)
    test_idx = stratified(test_labels, selection.test_size, seed)

    def take(t, y, idx):
        return Split([t[i] for i in idx], y[idx], idx)

    return NewsData(take(texts, labels, train_idx), take(texts, labels, val_idx),
                    take(test_texts, test_labels, test_idx), list(label_names), remove)


def load_data(selection: Selection, *, remove_headers: bool = False,
              archive: str | os.PathLike | None = None) -> NewsData:
    """20 Newsgroups (``bydate``): ``remove=REMOVE`` when ``remove_headers``; the posts ``selection`` draws (see
    :class:`Selection`); ``archive``: see :func:`bertlib.data.corpus.load_20newsgroups`."""
    remove = REMOVE if remove_headers else ()
    train = load_20newsgroups("train", remove=remove, archive=archive)
    test = load_20newsgroups("test", remove=remove, archive=archive)
    return split_data(train.data, train.target, test.data, test.target, train.target_names, selection, remove)


def head_tokens(max_length: int) -> int:
    """How many leading tokens head+tail truncation keeps: 128 of 510 at ``max_length=512`` as in Sun et al.
    (2019), the same share (about a quarter) for shorter limits."""
    return min(128, round((max_length - 2) * 128 / 510))


def truncate(body: list[int], max_length: int, strategy: str, cls_id: int, sep_id: int) -> list[int]:
    """``[CLS] body [SEP]`` cut to ``max_length`` ids. ``"head"``: the first ``max_length - 2`` tokens (what
    ``tokenizer(..., truncation=True, max_length=...)`` does); ``"head_tail"``: the first :func:`head_tokens` and
    the last ``max_length - 2 - head_tokens`` tokens, dropping the middle."""
    room = max_length - 2
    if len(body) > room:
        if strategy == "head":
            body = body[:room]
        elif strategy == "head_tail":
            head = head_tokens(max_length)
            body = body[:head] + body[len(body) - (room - head):]
        else:
            raise ValueError(f"truncation must be 'head' or 'head_tail', got {strategy!r}.")
    return [cls_id, *body, sep_id]


def token_counts(tokenizer, texts: list[str]) -> np.ndarray:
    """Length of each post in WordPiece tokens, without special tokens and without truncation."""
    return np.array([len(ids) for ids in body_ids(tokenizer, texts)])


def encode(tokenizer, texts: list[str], max_length: int, truncation: str = "head_tail") -> list[list[int]]:
    """Token ids of each post, ``[CLS] ... [SEP]``, at most ``max_length``, cut by ``truncation``."""
    return [truncate(ids, max_length, truncation, tokenizer.cls_token_id, tokenizer.sep_token_id)
            for ids in body_ids(tokenizer, texts)]
