"""Settings and records shared by the browser tests (conftest.py explains how they run and skip)."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("BOOK_HTML", ROOT / "_build" / "html"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = Path(os.environ.get("BOOK_SCREENSHOTS", ROOT / "_build" / "screenshots"))
#: The flags that work in containers and CI: no sandbox (root), no GPU, no network of Chromium's own.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]
VIEWPORT = {"width": 1280, "height": 900}
HERE = Path(__file__).resolve().parent


def missing_prerequisite() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not (HTML / "index.html").exists():
        return f"no built book at {HTML}: run `make book` first (or set BOOK_HTML)"
    if not (Path(CHROMIUM).exists() or shutil.which(CHROMIUM)):
        return f"chromium not found at {CHROMIUM}: `apt-get install -y chromium` (Debian) or set CHROMIUM"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the `playwright` package is missing: pip install -e '.[browser]' (never `playwright install`)"
    return None


@dataclass
class Visit:
    """What one page did in the browser."""

    docname: str
    url: str
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    external: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    bad_status: list[str] = field(default_factory=list)
    math: dict[str, Any] = field(default_factory=dict)
    images: list[dict[str, Any]] = field(default_factory=list)
    bertviz: list[dict[str, Any]] = field(default_factory=list)
    measured: str | None = None
    features: dict[str, Any] = field(default_factory=dict)
    screenshot: Path | None = None
    load_error: str | None = None
