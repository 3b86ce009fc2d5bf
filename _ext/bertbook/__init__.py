"""Sphinx extension for the book "BERT, Taken Apart" (enabled in _config.yml under ``sphinx.local_extensions``).

- :mod:`bertbook.offline`: the built HTML makes no request outside its own origin (require.js, d3, jQuery and
  MathJax come from npm at build time and are served from ``_vendor/``; CDN URLs are rewritten; an external
  resource left in a page is a warning, an error under ``-W``).
- :mod:`bertbook.measure`: each executed chapter states, at its end, the run time and peak memory the build measured.
- :mod:`bertbook.cachekey`: the execution cache is emptied when ``bertlib``, the settings or the package versions
  differ from those it was filled under (it may have been filled by ``make test``'s nbval run).
- ``static/bertbook.css``: wide interactive outputs (bertviz ``model_view``) scroll inside their own box.
- :mod:`bertbook.static_views`: a static picture of every bertviz view's attention, shown when JavaScript is off.
- :func:`chapters_number_their_figures`: ``numfig`` stays off, as ``_config.yml`` asks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

from . import accessibility, cachekey, measure, offline, static_views

logger = logging.getLogger(__name__)
STATIC = Path(__file__).with_name("static")


def _add_static(app: Sphinx) -> None:
    if app.builder.format == "html":
        app.config.html_static_path.append(str(STATIC))
        app.add_css_file("bertbook.css")


def _fresh_cache(app: Sphinx) -> None:
    path = Path(app.config.nb_execution_cache_path or ".jupyter_cache")
    if not path.is_absolute():
        path = Path(app.srcdir) / path
    if cachekey.ensure_fresh(path, Path(app.srcdir)):
        logger.info("bertbook: emptied the execution cache (bertlib, settings or versions changed since it was filled)")


def chapters_number_their_figures(app: Sphinx, config: Any) -> None:
    """config-inited, after every other extension: ``numfig = False``, as ``_config.yml`` sets it. The chapters
    number their figures in the caption text ("Figure 4.1"). Jupyter Book 1 loads ``sphinx_jupyterbook_latex``,
    whose own config-inited handler sets ``numfig = True`` for every builder (HTML too), so every ``{figure}``
    got a second, book-wide number in front of the chapter's ("Fig. 2 Figure 0.1", "Fig. 7 You are here")."""
    config.numfig = False


def setup(app: Sphinx) -> dict[str, Any]:
    # after sphinx_jupyterbook_latex's handler (default priority 500), which turns numfig on
    app.connect("config-inited", chapters_number_their_figures, priority=900)
    app.connect("config-inited", offline.use_vendored_mathjax)
    app.connect("builder-inited", _fresh_cache)
    app.connect("builder-inited", _add_static)
    app.connect("builder-inited", offline.copy_assets)
    app.connect("builder-inited", measure.install_kernel_hook)
    app.connect("source-read", measure.before_read)
    app.connect("doctree-read", measure.after_read)
    app.connect("env-purge-doc", measure.purge)
    app.connect("env-merge-info", measure.merge)
    # after sphinx.ext.mathjax (priority 500) has added its script tag, so the check below sees it too
    app.connect("html-page-context", offline.rewrite_page, priority=900)
    app.connect("html-page-context", static_views.add_static_pictures, priority=910)
    app.connect("build-finished", offline.check_written_pages)
    app.connect("build-finished", accessibility.fix_written_pages)
    app.connect("build-finished", measure.write_summary)
    return {"version": "0.1", "parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
