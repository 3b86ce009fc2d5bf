"""20 Newsgroups, online as scikit-learn fetches it, or offline from a local ``20news-bydate.tar.gz``; real
sentences from it (:func:`example_sentences`); a post's token ids (:func:`body_ids`). Batches of ids:
:mod:`bertlib.data.batches`.

Offline, the archive fills scikit-learn's own cache (``<data_home>/20news-bydate_py3.pkz``, a zlib-compressed
pickle of ``dict(train=load_files(...), test=load_files(...))``), so ``fetch_20newsgroups`` then works as usual.
scikit-learn is imported by the functions that read the data, not by this module: ``import bertlib`` does not load
it. Used from chapter 1, *Tokenization and the data*.
"""

from __future__ import annotations

import codecs
import itertools
import os
import pickle
import re
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bertlib.data.files import atomic_write
from bertlib.model.runtime import resolve_seed

#: Environment variable naming a local ``20news-bydate.tar.gz``.
ARCHIVE_ENV = "BERTLIB_20NG_ARCHIVE"
#: Documents per split in the ``bydate`` version, as scikit-learn documents them.
SPLIT_SIZES = {"train": 11314, "test": 7532}
#: Its classes: every stratified draw (:func:`bertlib.data.newsgroups.split_data`) needs a post of each.
N_CLASSES = 20
CACHE_NAME = "20news-bydate_py3.pkz"  # scikit-learn's name for its cache file
_FOLDERS = {"train": "20news-bydate-train", "test": "20news-bydate-test"}


def extract_safely(tar: tarfile.TarFile, dest: str | os.PathLike) -> None:
    """``tar.extractall(dest, filter="data")`` (no absolute paths, no ``..``, no links out of ``dest``, no device
    files). Python 3.11.0-3.11.3 (Debian 12's 3.11.2) have no extraction filters: there only regular files and
    folders with relative paths inside ``dest`` are extracted, and any other member is refused."""
    if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 (and the 3.8-3.10 security releases)
        tar.extractall(dest, filter="data")
        return
    root = Path(dest).resolve()
    members = tar.getmembers()
    for m in members:
        target = (root / m.name).resolve()
        if not (m.isfile() or m.isdir()) or Path(m.name).is_absolute() or not target.is_relative_to(root):
            raise tarfile.TarError(f"refusing to extract {m.name!r}: only files and folders inside the archive's "
                                   "own tree are extracted")
    tar.extractall(dest, members=members)


def check_sizes(train_size: int | None, test_size: int | None, val_fraction: float, n_classes: int = N_CLASSES) -> None:
    """Refuse subset sizes a stratified draw cannot make (scikit-learn would raise only after the model has loaded):
    the validation split and the training posts left each need a post of every one of ``n_classes`` classes."""
    def n_val(size: int) -> int:  # as split_data holds them out
        return max(n_classes, round(val_fraction * size))

    if train_size is not None and 1 <= train_size < n_val(train_size) + n_classes:
        least = next(n for n in itertools.count(2 * n_classes) if n >= n_val(n) + n_classes)
        raise ValueError(f"train_size={train_size} is too small: {n_val(train_size)} of them are held out for "
                         f"validation, and stratifying needs a post of each of the {n_classes} classes in both "
                         f"parts. Use train_size (--train-size) {least} or more, or None for every training post.")
    if test_size is not None and 1 <= test_size < n_classes:
        raise ValueError(f"test_size={test_size} is too small: a stratified draw needs at least one post of each of "
                         f"the {n_classes} classes. Use test_size (--test-size) {n_classes} or more, or None for every "
                         "test post.")



def build_cache(archive: str | os.PathLike, data_home: str | os.PathLike | None = None) -> Path:
    """Write scikit-learn's 20 Newsgroups cache from a local ``20news-bydate.tar.gz``; returns its path.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` for an archive that is not a readable
    ``tar.gz``, lacks the two split folders, or holds the wrong number of posts.
    """
    from sklearn.datasets import get_data_home, load_files

    archive = Path(archive).expanduser()
    if not archive.is_file():
        raise FileNotFoundError(
            f"20 Newsgroups archive not found: {archive}. Point {ARCHIVE_ENV} (or archive=) at a "
            "20news-bydate.tar.gz file."
        )
    cache_path = Path(get_data_home(data_home)) / CACHE_NAME
    with tempfile.TemporaryDirectory() as tmp:
        try:
            with tarfile.open(archive, "r:gz") as tar:
                extract_safely(tar, tmp)
        except (tarfile.TarError, OSError, EOFError) as err:
            raise ValueError(
                f"{archive} is not a readable tar.gz archive ({err}). Download 20news-bydate.tar.gz again."
            ) from err
        roots = {name: Path(tmp) / folder for name, folder in _FOLDERS.items()}
        if not all(p.is_dir() for p in roots.values()):
            found = sorted(p.name for p in Path(tmp).iterdir())
            raise ValueError(
                f"{archive} is not the 20news-bydate archive: expected top-level folders "
                f"{sorted(_FOLDERS.values())}, found {found}."
            )
        cache = {name: load_files(str(root), encoding="latin1") for name, root in roots.items()}
    for name, bunch in cache.items():
        if len(bunch.data) != SPLIT_SIZES[name]:
            raise ValueError(
                f"{archive} holds {len(bunch.data)} {name} posts, expected {SPLIT_SIZES[name]}: it is not the "
                "complete 20news-bydate archive."
            )
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(cache_path) as tmp:  # a reader never sees half a cache
        tmp.write_bytes(codecs.encode(pickle.dumps(cache), "zlib_codec"))
    return cache_path


def load_20newsgroups(
    subset: str = "train",
    remove: tuple[str, ...] = (),
    archive: str | os.PathLike | None = None,
    data_home: str | os.PathLike | None = None,
    **kwargs,
) -> Any:
    """``sklearn.datasets.fetch_20newsgroups(subset, remove=remove, ...)`` that also works offline.

    ``archive`` (or ``$BERTLIB_20NG_ARCHIVE``): a local ``20news-bydate.tar.gz`` used to fill scikit-learn's
    cache when it is empty. Without one, scikit-learn downloads the data (online). ``remove`` may hold
    ``"headers"``, ``"footers"``, ``"quotes"``. Other keyword arguments go to ``fetch_20newsgroups``.
    Returns its ``Bunch`` (``data``, ``target``, ``target_names``, ``filenames``).
    """
    from sklearn.datasets import fetch_20newsgroups, get_data_home

    if subset not in ("train", "test", "all"):
        raise ValueError(f"subset must be 'train', 'test' or 'all', got {subset!r}.")
    archive = archive or os.environ.get(ARCHIVE_ENV) or None
    cache_path = Path(get_data_home(data_home)) / CACHE_NAME
    if archive is not None and not cache_path.exists():
        build_cache(archive, data_home)
    try:
        bunch = fetch_20newsgroups(subset=subset, remove=remove, data_home=data_home,
                                   download_if_missing=archive is None, **kwargs)
    except OSError as err:  # no network (URLError is an OSError), or no cache and no download
        raise OSError(
            f"20 Newsgroups is not available offline ({err}). Download 20news-bydate.tar.gz once, then set "
            f"{ARCHIVE_ENV}=/path/to/20news-bydate.tar.gz (or pass archive=...) and it fills scikit-learn's "
            f"cache in {cache_path.parent}."
        ) from err
    if "categories" not in kwargs and subset in SPLIT_SIZES and len(bunch.data) != SPLIT_SIZES[subset]:
        raise ValueError(
            f"the cached {subset} split has {len(bunch.data)} posts, expected {SPLIT_SIZES[subset]}: delete "
            f"{cache_path} and load again from a complete archive."
        )
    return bunch


#: What makes a sentence unfit to show or to train on: e-mail addresses, quoting marks, ASCII art, markup.
_NOT_PROSE = re.compile(r"[@<>|#*=_~^\\]")


def sentences(text: str) -> list[str]:
    """``text`` with its whitespace normalised, split after ``.``, ``!`` or ``?``: rough sentences."""
    return re.split(r"(?<=[.!?])\s+", " ".join(text.split()))


def plain_sentence(sentence: str, min_words: int, max_words: int) -> bool:
    """Whether ``sentence`` reads as prose: ``min_words`` to ``max_words`` words, plain ASCII, no e-mail address,
    quoting mark or ASCII art. The filter of :func:`example_sentences` and of chapter 11's corpus
    (:func:`bertlib.data.pretraining_data.split_sentences`)."""
    return min_words <= len(sentence.split()) <= max_words and sentence.isascii() and not _NOT_PROSE.search(sentence)


def example_sentences(
    n: int = 3,
    *,
    subset: str = "train",
    seed: int | None = None,
    min_words: int = 6,
    max_words: int = 24,
    **kwargs,
) -> list[str]:
    """``n`` real sentences from 20 Newsgroups posts (headers, signatures and quotes removed), chosen by ``seed``
    (default ``$BERTLIB_SEED``, else 0).

    Each is the first sentence of a post with ``min_words`` to ``max_words`` words, plain ASCII and no e-mail
    addresses (:func:`plain_sentence`), ending in ``.``, ``!`` or ``?``, so the chapters show real text of
    different lengths (a padded batch). Keyword arguments go to :func:`load_20newsgroups` (``archive``,
    ``data_home``).
    """
    bunch = load_20newsgroups(subset, remove=("headers", "footers", "quotes"), **kwargs)
    rng = np.random.default_rng(resolve_seed(seed))
    chosen: list[str] = []
    for i in rng.permutation(len(bunch.data)):
        first = sentences(bunch.data[i])[0]
        if first[-1:] in ".!?" and plain_sentence(first, min_words, max_words):
            chosen.append(first)
            if len(chosen) == n:
                return chosen
    raise ValueError(
        f"only {len(chosen)} posts have a first sentence of {min_words}-{max_words} words; relax the bounds.")


def body_ids(tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Each text's WordPiece ids without special tokens and without truncation (the body that truncation or
    windows then cut; a post longer than ``model_max_length`` is expected here, so the tokenizer's warning is off)."""
    return tokenizer(list(texts), add_special_tokens=False, truncation=False, verbose=False)["input_ids"]


