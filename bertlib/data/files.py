"""Writing a file so that a reader never sees half of it: the checkpoint, the best weights, ``metrics.json``,
scikit-learn's 20 Newsgroups cache. An interrupted run (a killed job, a full disk) leaves the previous file or
none, never a truncated one that a resume would then trust."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (``NAME.tmp``) to write to; on leaving the block it replaces ``path``
    in one step (``os.replace``, atomic on one file system). If the block raises, the temporary file is removed
    and ``path`` is left as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    """``Path(path).write_text(text)``, atomically (:func:`atomic_write`)."""
    with atomic_write(path) as tmp:
        tmp.write_text(text)
