"""20 Newsgroups offline: the real archive fills scikit-learn's cache; bad archives and no data fail clearly."""

from __future__ import annotations

import os
import urllib.error
from pathlib import Path

import pytest

from bertlib.data import batches
from bertlib.data import corpus as data
from helpers import tar_gz

ARCHIVE = os.environ.get(data.ARCHIVE_ENV)
needs_archive = pytest.mark.skipif(not ARCHIVE, reason=f"set {data.ARCHIVE_ENV} to the real 20news-bydate.tar.gz")


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> tuple[Path, object]:
    """A fresh scikit-learn data home, filled once for this module by ``load_20newsgroups("test", archive=...)``
    (building the cache takes seconds: one build serves every test here), and what that call returned."""
    home = tmp_path_factory.mktemp("sklearn_data")
    assert not (home / data.CACHE_NAME).exists()
    return home, data.load_20newsgroups("test", archive=ARCHIVE, data_home=home) if ARCHIVE else None


@pytest.fixture(scope="module")
def data_home(filled) -> Path:
    return filled[0]


@needs_archive
def test_split_sizes_and_labels(data_home):
    train = data.load_20newsgroups("train", data_home=data_home)
    test = data.load_20newsgroups("test", data_home=data_home)
    assert (len(train.data), len(test.data)) == (11314, 7532)
    assert len(train.target_names) == 20 and train.target_names == test.target_names
    assert train.target_names[0] == "alt.atheism" and train.target_names[-1] == "talk.religion.misc"
    assert set(train.target) == set(range(20))
    assert len(data.load_20newsgroups("all", data_home=data_home).data) == 11314 + 7532


@needs_archive
def test_one_known_document(data_home):
    """The first training post in sklearn's (shuffled, seed 42) order is the well-known 'WHAT car is this!?'."""
    train = data.load_20newsgroups("train", data_home=data_home)
    assert train.target_names[train.target[0]] == "rec.autos"
    assert "Subject: WHAT car is this!?" in train.data[0]
    stripped = data.load_20newsgroups("train", remove=("headers", "footers", "quotes"), data_home=data_home)
    assert "Subject:" not in stripped.data[0] and "I was wondering if anyone out there" in stripped.data[0]


@needs_archive
def test_archive_argument_fills_an_empty_cache(filled):
    home, bunch = filled  # the fixture's call on an empty data home
    assert len(bunch.data) == 7532 and (home / data.CACHE_NAME).is_file()


@needs_archive
def test_example_sentences_are_real_and_deterministic(data_home):
    a = data.example_sentences(3, seed=0, data_home=data_home)
    assert (a == data.example_sentences(3, seed=0, data_home=data_home)
            != data.example_sentences(3, seed=1, data_home=data_home))
    assert len({len(s.split()) for s in a}) > 1  # different lengths: a padded batch


def test_missing_archive_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="archive not found.*BERTLIB_20NG_ARCHIVE"):
        data.load_20newsgroups("train", archive=tmp_path / "nope.tar.gz", data_home=tmp_path)


def test_corrupt_archive(tmp_path):
    bad = tmp_path / "20news-bydate.tar.gz"
    bad.write_bytes(b"this is not a gzip file" * 10)
    with pytest.raises(ValueError, match="not a readable tar.gz archive"):
        data.load_20newsgroups("train", archive=bad, data_home=tmp_path)


def test_wrong_archive_layout(tmp_path):
    wrong = tar_gz(tmp_path / "other.tar.gz", {"something-else/a.txt": b"hello"})
    with pytest.raises(ValueError, match="not the 20news-bydate archive.*something-else"):
        data.load_20newsgroups("train", archive=wrong, data_home=tmp_path)
    assert not (tmp_path / data.CACHE_NAME).exists()


def test_incomplete_archive(tmp_path):
    files = {f"20news-bydate-{s}/sci.space/{i}": b"From: a\n\nbody" for s in ("train", "test") for i in range(3)}
    small = tar_gz(tmp_path / "20news-bydate.tar.gz", files)
    with pytest.raises(ValueError, match="holds 3 train posts, expected 11314"):
        data.load_20newsgroups("train", archive=small, data_home=tmp_path)


def test_offline_without_archive_says_how_to_fix(tmp_path, monkeypatch):
    monkeypatch.delenv(data.ARCHIVE_ENV, raising=False)

    def no_network(*args, **kwargs):
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr("sklearn.datasets._twenty_newsgroups._download_20newsgroups", no_network)
    with pytest.raises(OSError, match="not available offline.*BERTLIB_20NG_ARCHIVE=/path/to/20news-bydate.tar.gz"):
        data.load_20newsgroups("train", data_home=tmp_path)


def test_bad_subset():
    with pytest.raises(ValueError, match="subset must be"):
        data.load_20newsgroups("validation")


# ------------------------------------------------------------------------------- the one padding collator


def test_pad_batch_of_token_id_lists_is_the_tokenizers_padding(pretrained):
    """Plain id lists (what fine-tuning batches) pad as ``tokenizer.pad`` and ``DataCollatorWithPadding`` do."""
    import torch
    from transformers import DataCollatorWithPadding

    tok = pretrained.tokenizer
    texts = ["a short one.", "a somewhat longer sentence than the first.", "mid length text here"]
    encodings = [tok(t) for t in texts]
    ours = batches.pad_batch([e["input_ids"] for e in encodings], tok.pad_token_id)
    theirs = DataCollatorWithPadding(tok, return_tensors="pt")([dict(e) for e in encodings])
    assert ours.keys() == {"input_ids", "attention_mask", "token_type_ids"}
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key
    assert (ours["attention_mask"] == 0).any(), "the batch should need padding"
    with pytest.raises(ValueError, match="no encodings"):
        batches.pad_batch([], 0)
    with pytest.raises(ValueError, match="same keys"):
        batches.pad_batch([{"input_ids": [1]}, [1, 2]], 0)


def test_the_posts_come_from_any_selection():
    """The data layer draws a run's posts from a ``Selection`` (four fields), not from fine-tuning's config: a
    ``FinetuneConfig`` is one, a plain object with the same values draws the same posts, and ``load_data``'s options
    are keywords (an archive passed where ``remove_headers`` was is an error, not a silent True)."""
    from dataclasses import dataclass

    from bertlib.data import newsgroups
    from bertlib.training.finetune_config import profile_config

    @dataclass(frozen=True)
    class Plain:
        train_size: int
        test_size: int
        val_fraction: float
        data_seed: int

    texts, labels = [f"post {i}" for i in range(200)], [i % 4 for i in range(200)]
    plain = newsgroups.split_data(texts, labels, texts[:40], labels[:40], list("abcd"), Plain(80, 20, 0.25, 3))
    cfg = profile_config("quick", train_size=80, test_size=20, val_fraction=0.25, data_seed=3)
    config = newsgroups.split_data(texts, labels, texts[:40], labels[:40], list("abcd"), cfg)
    for split in ("train", "val", "test"):
        assert list(getattr(plain, split).index) == list(getattr(config, split).index)
    assert (len(plain.train) + len(plain.val), len(plain.val), len(plain.test)) == (80, 20, 20)
    with pytest.raises(TypeError):
        newsgroups.load_data(Plain(80, 20, 0.25, 3), "20news-bydate.tar.gz")
