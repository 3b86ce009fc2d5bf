"""The notebooks listed in _toc.yml, in book order. `python tests/toc.py` prints their paths (for nbval)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def toc_files(toc: dict | list | None = None) -> list[str]:
    """Every `file:`/`root:` entry of _toc.yml (without suffix), depth first, in reading order."""
    if toc is None:
        toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    found: list[str] = []
    if isinstance(toc, dict):
        for key in ("root", "file"):
            if key in toc:
                found.append(str(toc[key]))
        for key in ("parts", "chapters", "sections"):
            for entry in toc.get(key, []):
                found += toc_files(entry)
    return found


def core_files(toc: dict | None = None) -> list[str]:
    """The `file:` entries of the parts whose caption starts with "Core path", in reading order."""
    if toc is None:
        toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [f for part in toc.get("parts", []) if str(part.get("caption", "")).startswith("Core path")
            for f in toc_files(part)]


def core_notebooks() -> list[Path]:
    """The core path's `.ipynb` files (parts captioned "Core path: ..."), in reading order."""
    return [ROOT / f"{f}.ipynb" for f in core_files() if (ROOT / f"{f}.ipynb").exists()]


def notebooks() -> list[Path]:
    """The `.ipynb` files the book's table of contents names, in reading order."""
    return [ROOT / f"{f}.ipynb" for f in toc_files() if (ROOT / f"{f}.ipynb").exists()]


if __name__ == "__main__":
    print(" ".join(str(p.relative_to(ROOT)) for p in notebooks()))
