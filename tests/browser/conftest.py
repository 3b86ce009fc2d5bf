"""Browser tests of the built HTML book: Debian's chromium, driven by Playwright, against _build/html served on
127.0.0.1. Run them with `make browser-test` after `make book` (or `pytest tests/browser`).

They are skipped, with the reason, when they were not asked for (a plain `pytest tests` / `make unit`), when
there is no built book, when chromium is missing or when the `playwright` package is not installed. With
BOOK_BROWSER_REQUIRED=1 (what `make browser-test` sets) a missing prerequisite is a failure instead.

Settings (environment): BOOK_HTML (default <repo>/_build/html), CHROMIUM (default /usr/bin/chromium),
BOOK_SCREENSHOTS (default <repo>/_build/screenshots).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .book_browser import CHROMIUM, CHROMIUM_ARGS, HERE, HTML, VIEWPORT, missing_prerequisite


def _requested(config: pytest.Config) -> bool:
    if os.environ.get("BOOK_BROWSER_TESTS") or os.environ.get("BOOK_BROWSER_REQUIRED"):
        return True
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path == HERE or HERE in path.parents:
            return True
    return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.fspath)).resolve().parents]
    if not mine:
        return
    for book in (True, False):  # test_lab_offline.py runs a live notebook: it needs JupyterLab, not a built book
        group = [item for item in mine if (Path(str(item.fspath)).name != "test_lab_offline.py") == book]
        if not group:
            continue
        if not _requested(config):
            reason = ("browser tests run on the built book and in JupyterLab: `make browser-test` after `make book` "
                      "(or pytest tests/browser)")
        else:
            reason = missing_prerequisite(book=book)
            if reason and os.environ.get("BOOK_BROWSER_REQUIRED"):
                raise pytest.UsageError(f"browser tests required but cannot run: {reason}")
        if reason:
            for item in group:
                item.add_marker(pytest.mark.skip(reason=reason))


# ----------------------------------------------------------------------------------------------- fixtures

class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:  # no access log on stderr
        pass


@pytest.fixture(scope="session")
def site() -> Iterator[str]:
    """The built book served on 127.0.0.1 (a free port), the origin every request must stay on."""
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Debian's chromium (never a browser downloaded by Playwright), with a fresh empty profile."""
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="book-chromium-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS, viewport=VIEWPORT,
            service_workers="block")
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)


