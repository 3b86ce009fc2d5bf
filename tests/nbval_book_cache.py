"""pytest plugin: the notebooks nbval executes fill the book's execution cache, so each runs once in CI.

``make test`` loads it (``-p tests.nbval_book_cache --nbval-book-cache``). nbval stays the notebook test: it runs
every cell and fails on any exception. When *every* cell of a notebook has passed, this plugin stores the notebook
with the outputs nbval collected into the jupyter-cache that ``_config.yml`` names (``execute.cache``), keyed as
jupyter-cache keys it (the code cells' text). ``make book`` (``execute_notebooks: cache``) then renders those
outputs instead of executing the notebook again; a notebook that failed, or was not run, is executed by the build.
Before storing anything, the cache is emptied if ``bertlib``, the settings or the versions changed since it was
filled (``_ext/bertbook/cachekey.py``): the book never shows outputs of code that has since changed.

The kernels nbval starts measure their run time and peak memory the same way the book build's kernels do
(``_ext/bertbook/measure.py``), so each chapter page still states what its execution cost.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
# The book's own extension (one definition of each rule), _ext/bertbook, is imported where it is used: pytest
# imports this plugin (-p) before it puts pyproject.toml's `pythonpath` (_ext among them) on sys.path.


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--nbval-book-cache", action="store_true",
                     help="store every notebook whose cells all passed, with its outputs, in the book's execution "
                          "cache (execute.cache in _config.yml), so that `make book` does not execute it again")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--nbval-book-cache"):
        book = yaml.safe_load((ROOT / "_config.yml").read_text())
        # Under pytest-xdist (make test runs notebooks on two workers) the controller prepares the cache and the
        # kernels' startup file once, before any worker starts; each worker then stores the notebooks it ran.
        prepare = not hasattr(config, "workerinput")
        config.pluginmanager.register(BookCache(ROOT / book["execute"]["cache"], prepare), "nbval-book-cache")


def _is_cell(item: pytest.Item) -> bool:
    return type(item).__name__ == "IPyNbCell"


def _docname(item: pytest.Item) -> str:
    return Path(str(item.parent.fspath)).resolve().relative_to(ROOT).with_suffix("").as_posix()


class BookCache:
    """Collects each notebook's cell outputs and outcome; stores the notebook when its last cell has run."""

    def __init__(self, cache: Path, prepare: bool = True) -> None:
        from bertbook import cachekey, measure, offline

        self.cache = cache
        self.state = measure.state_dir(ROOT / "_build")
        if prepare and cachekey.ensure_fresh(cache, ROOT):
            print(f"nbval-book-cache: emptied {cache} (bertlib, settings or versions changed since it was filled)")
        self.ipython = measure.install_startup(self.state) if prepare else self.state / "ipython"
        # the stored outputs go into the book, which serves its own bertviz assets: keep bertviz's CDN URLs there
        os.environ.setdefault(offline.BERTVIZ_ASSETS_ENV, "cdn")
        self.seconds: dict[str, float] = {}
        self.failed: set[str] = set()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        if not _is_cell(item):
            yield
            return
        from bertbook import measure

        doc = _docname(item)
        if item.cell_num == 0:  # the kernel starts in this cell's setup: it inherits these variables
            self.seconds[doc] = 0.0
            os.environ["IPYTHONDIR"] = str(self.ipython)
            os.environ[measure.ENV_VAR] = str(measure.record_path(self.state, doc, pending=True))
        yield
        if nextitem is None or nextitem.parent is not item.parent:
            os.environ.pop(measure.ENV_VAR, None)
            if doc not in self.failed:
                self.store(item.parent, doc)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if ".ipynb::" not in report.nodeid:
            return
        doc = Path(report.nodeid.split("::")[0]).with_suffix("").as_posix()
        self.seconds[doc] = self.seconds.get(doc, 0.0) + report.duration
        if report.failed or report.skipped:
            self.failed.add(doc)

    def store(self, notebook_file: pytest.Collector, doc: str) -> None:
        """The executed notebook into the cache, and its measurement where the book build looks for it."""
        from jupyter_cache import get_cache
        from jupyter_cache.base import CacheBundleIn

        from bertbook import measure

        cells = [c for c in notebook_file.session.items if _is_cell(c) and c.parent is notebook_file]
        nb = copy.deepcopy(notebook_file.nb)
        code = [c for c in nb.cells if c.cell_type == "code"]
        if len(code) != len(cells) or any(c.test_outputs is None for c in cells):
            return  # not every cell ran (e.g. -k selected some): nothing trustworthy to store
        for n, (cell, item) in enumerate(zip(code, cells, strict=True), start=1):
            cell.outputs = copy.deepcopy(item.test_outputs)
            cell.execution_count = n
        nbformat.validate(nb)
        seconds = round(self.seconds[doc], 3)
        get_cache(str(self.cache)).cache_notebook_bundle(
            CacheBundleIn(nb, str(notebook_file.fspath), data={"execution_seconds": seconds}),
            check_validity=False, overwrite=True)
        pending = measure.record_path(self.state, doc, pending=True)
        if pending.exists():
            record = json.loads(pending.read_text())
            record.update(runtime_s=seconds, executed_by="nbval", recorded_at=time.time())
            measure.record_path(self.state, doc, pending=False).write_text(json.dumps(record, indent=1) + "\n")
            pending.unlink()
