"""The book's execution cache is valid only for the code and settings that filled it.

jupyter-cache matches a notebook by the text of its code cells alone, so after a change to ``bertlib`` (or to the
profile, seed, model or package versions) it would still hand back outputs computed by the old code. Both fillers
of the cache, the book build (:mod:`bertbook`) and the nbval run of ``make test`` (``tests/nbval_book_cache.py``),
call :func:`ensure_fresh` first: it empties the cache when this fingerprint differs from the one it was filled
under. No Sphinx and no torch import here, so the pytest plugin can use it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from importlib import metadata
from pathlib import Path

#: Environment variables that change what a notebook computes.
SETTINGS = ("BERTLIB_PROFILE", "BERTLIB_SEED", "BERTLIB_NUM_THREADS", "BERTLIB_MODEL", "BERTLIB_DEVICE")
#: Packages whose versions change what a notebook computes or how its outputs look.
PACKAGES = ("torch", "transformers", "tokenizers", "scikit-learn", "numpy", "bertviz", "matplotlib")
STAMP = "bertlib-fingerprint.json"


def fingerprint(root: Path) -> dict[str, object]:
    """What the cached outputs depend on besides the cells' code: bertlib's source, the quizzes the chapters show,
    settings, versions."""
    digest = hashlib.sha256()
    quizzes = sorted((root / "quizzes").glob("*.json"))
    for path in sorted((root / "bertlib").rglob("*.py")) + quizzes + [root / "pyproject.toml"]:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return {"bertlib_sha256": digest.hexdigest(), "settings": {k: os.environ.get(k) for k in SETTINGS},
            "versions": versions}


def ensure_fresh(cache: Path, root: Path) -> bool:
    """Empty ``cache`` if it was filled under another :func:`fingerprint`; record the current one. Returns True
    when the cache was emptied."""
    cache, current = Path(cache), fingerprint(Path(root))
    stamp = cache / STAMP
    stale = cache.exists() and (not stamp.exists() or json.loads(stamp.read_text()) != current)
    if stale:
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    stamp.write_text(json.dumps(current, indent=1, sort_keys=True) + "\n")
    return stale
