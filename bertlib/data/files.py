"""Writing a file so that a reader never sees half of it: the checkpoint, the best weights, ``metrics.json``,
scikit-learn's 20 Newsgroups cache. An interrupted run (a killed job, a full disk) leaves the previous file or
none, never a truncated one that a resume would then trust."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to, unique to this call (``NAME.<pid>.<random>.tmp``: two
    processes or threads filling the same cache at once never share one); on leaving the block it replaces
    ``path`` in one step (``os.replace``, atomic on one file system: the last writer wins, and a reader sees one
    whole file). If the block raises, the temporary file is removed and ``path`` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    """``Path(path).write_text(text)``, atomically (:func:`atomic_write`)."""
    with atomic_write(path) as tmp:
        tmp.write_text(text)


def check_output(path: str | os.PathLike, option: str = "--out", *, directory: bool = False) -> Path:
    """Refuse, before any work, an output the run could not write at its end: ``path`` (a file, or with
    ``directory=True`` a folder that is created if missing) must lie in an existing, writable folder. Returns it."""
    path = Path(path).expanduser()
    if directory:
        if path.exists() and not path.is_dir():
            raise ValueError(f"{option} {path} is a file, not a folder: choose a folder (it is created if missing).")
        parent = next(p for p in (path, *path.parents) if p.exists())
    else:
        if path.is_dir():
            raise ValueError(f"{option} {path} is a folder: give a file name, e.g. {path / 'out.json'}.")
        parent = path.parent
        if not parent.is_dir():
            raise ValueError(f"{option} {path}: the folder {parent} does not exist. Create it first "
                             f"(mkdir -p {parent}) or choose another {option}.")
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{option} {path}: cannot write in {parent} (not a writable folder). Choose another "
                         f"{option}.")
    return path


def project_path(name: str) -> Path:
    """``name`` (``quizzes``, ``node_modules``, ``_build``) in the course's repository. In a clone or an editable
    install, the folder beside the ``bertlib`` package (``pyproject.toml`` is there). From ``pip install .`` (the
    package in site-packages, no repository beside it): the current folder or the nearest parent that holds
    ``name`` (a notebook runs in ``chapters/``, its repository one level up), else the current folder's."""
    package = next(p for p in Path(__file__).resolve().parents if p.name == "bertlib")
    if (package.parent / "pyproject.toml").is_file():
        return package.parent / name
    here = Path.cwd()
    return next((p / name for p in (here, *here.parents) if (p / name).exists()), here / name)
