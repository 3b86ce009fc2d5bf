"""A reader's live notebook, offline: the chapters with bertviz views, run in JupyterLab in a real browser.

JupyterLab starts on 127.0.0.1 with a token, as ``make lab`` starts it (``JUPYTER_PREFER_ENV_PATH=1``, so the course
kernel that every notebook names, ``python3``, is the one used), serving a copy of the chapter (never the checkout's
own file: JupyterLab saves what it runs). Debian's chromium opens the notebook with every request that leaves
127.0.0.1 aborted (a classroom behind a firewall), runs all cells, and the test checks that every code cell ran
without an error and that each bertviz view drew its SVG (tokens as text, attention as lines): bertlib.course.setup()
made the views load require.js, d3 and jQuery from node_modules/ instead of the CDNs (bertlib/course/notebook.py).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from .book_browser import ROOT, SCREENSHOTS, VIEWPORT

#: The chapters whose cells show bertviz views (head_view; model_view and neuron_view).
CHAPTERS = ["chapters/05_multi_head_attention.ipynb", "chapters/07_encoder.ipynb"]
RUN_TIMEOUT_S = 300        # all cells of one chapter: about 10-20 s on 2 idle cores, minutes on a loaded one
START_TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """JupyterLab serving a copy of the chapters (and the figures their markdown shows) on 127.0.0.1."""
    work = tmp_path_factory.mktemp("lab")
    (work / "chapters").mkdir()
    for chapter in CHAPTERS:
        shutil.copy(ROOT / chapter, work / chapter)
    shutil.copytree(ROOT / "figures", work / "figures", ignore=shutil.ignore_patterns("*.py"))
    token, port = secrets.token_hex(16), _free_port()
    env = dict(os.environ, JUPYTER_PREFER_ENV_PATH="1", JUPYTER_RUNTIME_DIR=str(work / ".runtime"),
               JUPYTER_CONFIG_DIR=str(work / ".config"), JUPYTERLAB_SETTINGS_DIR=str(work / ".settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(work / ".workspaces"),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("BERTLIB_BERTVIZ_ASSETS", None)        # what a reader has: the default, views from node_modules/
    env.pop("IPYTHONDIR", None)
    log = open(work / "jupyterlab.log", "w")  # noqa: SIM115 (closed below)
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
         "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        + (["--allow-root"] if hasattr(os, "geteuid") and os.geteuid() == 0 else []),
        cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            log.close()
            pytest.fail(f"JupyterLab did not start:\n{(work / 'jupyterlab.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield {"url": url, "token": token, "work": work}
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


_KERNEL = """() => {
  const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return k ? {name: k.name, status: k.status, display: w.sessionContext.kernelDisplayName,
              path: w.context.path} : null;
}"""

# Every code cell: its execution count and the type of each output (from the notebook model, as it will be saved).
_CELLS = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  const cells = [];
  for (const cell of w.content.model.cells) {
    if (cell.type !== 'code') continue;
    const outputs = cell.outputs.toJSON();
    cells.push({count: cell.executionCount, errors: outputs.filter(o => o.output_type === 'error')
                  .map(o => o.ename + ': ' + o.evalue)});
  }
  return {cells, status: w.sessionContext.session.kernel.status};
}"""

_BERTVIZ = """() => [...document.querySelectorAll('div[id^="bertviz-"]')].map(d => ({
  id: d.id, svg: d.querySelectorAll('svg').length, text: d.querySelectorAll('svg text').length,
  lines: d.querySelectorAll('svg line, svg path, svg rect').length}))"""


@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda c: Path(c).stem)
def test_chapter_runs_offline_and_bertviz_draws(lab: dict[str, Any], browser: Any, chapter: str):
    started = time.monotonic()
    page = browser.new_page()
    page.set_viewport_size(VIEWPORT)
    blocked: list[str] = []
    page_errors: list[str] = []

    def gate(route: Any) -> None:
        if urlparse(route.request.url).hostname == "127.0.0.1":
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    page.route("**/*", gate)
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    try:
        # a workspace of its own, reset: only this notebook open, and it is the current widget
        page.goto(f"{lab['url']}/lab/workspaces/{Path(chapter).stem}/tree/{chapter}?reset&token={lab['token']}",
                  wait_until="domcontentloaded")
        page.wait_for_function(f"() => {{ const k = ({_KERNEL})(); return k && k.status === 'idle'; }}",
                               timeout=START_TIMEOUT_S * 1000)
        kernel = page.evaluate(_KERNEL)
        assert kernel["path"] == chapter, f"JupyterLab shows {kernel['path']}, not {chapter}"
        assert kernel["name"] == "python3", f"the notebook opened with kernel {kernel}, not the course kernel"
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        # done when every code cell has run, or a cell failed (run-all stops there), and the kernel is idle
        try:
            page.wait_for_function(
                f"""() => {{ const r = ({_CELLS})();
                     return r.status === 'idle' && (r.cells.every(c => c.count !== null)
                                                    || r.cells.some(c => c.errors.length)); }}""",
                timeout=RUN_TIMEOUT_S * 1000, polling=1000)
        except Exception as e:
            pytest.fail(f"{chapter}: the cells did not finish in {RUN_TIMEOUT_S} s ({e.__class__.__name__}): "
                        f"{page.evaluate(_CELLS)}; page errors {page_errors}; blocked {blocked}")
        cells = page.evaluate(_CELLS)["cells"]
        failed = [(i, c["errors"]) for i, c in enumerate(cells) if c["errors"]]
        assert not failed, f"{chapter}: code cells failed in JupyterLab: {failed}"
        assert all(c["count"] is not None for c in cells), f"{chapter}: not every code cell ran"
        try:  # bertviz draws once require.js has loaded d3 and jQuery
            page.wait_for_function(f"() => {{ const v = ({_BERTVIZ})(); return v.length && "
                                   "v.every(x => x.text > 0 && x.lines > 0); }", timeout=60_000)
        except Exception:  # the assertion below says what is missing
            pass
        views = page.evaluate(_BERTVIZ)
        assert views, f"{chapter}: no bertviz view in the page"
        blank = [v for v in views if not (v["svg"] and v["text"] and v["lines"])]
        assert not blank, (f"{chapter}: bertviz views drew nothing offline: {blank} (blocked requests: {blocked}; "
                           f"page errors: {page_errors})")
        cdn = [u for u in blocked if any(h in u for h in ("cdnjs", "jsdelivr", "unpkg", "jquery", "d3"))]
        assert not cdn, f"{chapter}: the notebook still asked CDNs for {cdn}"
        assert not blocked, f"{chapter}: JupyterLab or a view tried to reach outside 127.0.0.1: {blocked}"
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.locator('div[id^="bertviz-"]').first.scroll_into_view_if_needed()
        page.screenshot(path=str(SCREENSHOTS / f"lab__{Path(chapter).stem}.png"))
        summary = {"chapter": chapter, "seconds": round(time.monotonic() - started, 1), "code_cells": len(cells),
                   "bertviz_views": views, "kernel": kernel, "blocked": blocked}
        print(json.dumps(summary))
    finally:
        page.close()
