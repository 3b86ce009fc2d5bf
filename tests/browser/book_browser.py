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
#: axe-core from npm (package.json's devDependencies), injected into every page of the book: the accessibility check.
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
#: What the check covers: WCAG 2.0 and 2.1, levels A and AA (axe-core's rule tags), and the impacts that fail it.
AXE_TAGS = ("wcag2a", "wcag2aa", "wcag21a", "wcag21aa")
AXE_FAILING = ("serious", "critical")


def missing_prerequisite(book: bool = True) -> str | None:
    """Why the browser tests cannot run here, or None. ``book=False``: the live-notebook test
    (test_lab_offline.py), which needs JupyterLab and the npm copies of bertviz's assets instead of a built book."""
    if book and not (HTML / "index.html").exists():
        return f"no built book at {HTML}: run `make book` first (or set BOOK_HTML)"
    if not book:
        try:
            import jupyterlab  # noqa: F401
        except ImportError:
            return "JupyterLab is missing: pip install -e '.[browser]' (or `make lab`)"
        if not (ROOT / "node_modules" / "requirejs" / "require.js").exists():
            return "no node_modules/ (bertviz's require.js, d3, jQuery): run `npm ci` (make book / make lab do)"
    if book and not AXE.exists():
        return f"no {AXE.relative_to(ROOT)} (the accessibility check): run `npm ci --ignore-scripts` (make book does)"
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
    #: axe-core's WCAG 2 A/AA violations on the page: rule id, impact, help text and the first offending nodes.
    axe: list[dict[str, Any]] | None = None
