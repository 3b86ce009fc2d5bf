"""bertlib.course.notebook: in a live notebook, bertviz's views load require.js, d3 and jQuery from node_modules, not
from
CDNs (the browser test tests/browser/test_lab_offline.py proves they draw in JupyterLab with the network blocked)."""

from __future__ import annotations

import re

import pytest
import torch

from bertlib.course import bertviz_assets, notebook

pytest.importorskip("IPython")
bertviz = pytest.importorskip("bertviz")
_LOAD = re.compile(r"<script\s+src=[\"']https?://|\b(?:d3|jquery)\s*:\s*[\"']https?://")


def _shell():
    from IPython.core.interactiveshell import InteractiveShell

    return InteractiveShell.instance()


def _assets():
    assets = notebook.vendored_assets()
    if assets is None:
        pytest.skip(f"no npm copies in {bertviz_assets.node_modules_dir()}: run `npm ci` (make book / make lab do)")
    return assets


@pytest.mark.parametrize("view", ["head_view", "model_view"])
def test_every_cdn_load_in_a_bertviz_view_is_replaced(view):
    attention = [torch.rand(1, 2, 4, 4).softmax(-1) for _ in range(2)]
    html = getattr(bertviz, view)(attention, ["[CLS]", "a", "b", "[SEP]"], html_action="return").data
    assert _LOAD.search(html), f"bertviz {view} no longer loads from a CDN: update bertlib/course/notebook.py"
    new, n = notebook.inline_assets(html, _assets())
    assert n == 3 and not _LOAD.search(new)
    assert new.count("data:text/javascript;base64,") == 2 and "<script>" in new


def test_formatters_rewrite_what_bertviz_displays(monkeypatch):
    from IPython.display import HTML, Javascript

    _assets()
    monkeypatch.delenv(bertviz_assets.ASSETS_ENV, raising=False)
    shell = _shell()
    try:
        assert notebook.use_vendored_bertviz_assets(shell) == "inline"
        tag = '<script src="https://cdnjs.cloudflare.com/ajax/libs/require.js/2.3.6/require.min.js"></script>'
        html = shell.display_formatter.format(HTML(tag))[0]["text/html"]
        assert "cdnjs" not in html and "requirejs" in html
        js = ("require.config({paths: {d3: 'https://cdnjs.cloudflare.com/ajax/libs/d3/5.7.0/d3.min', "
              "jquery: 'https://cdnjs.cloudflare.com/ajax/libs/jquery/2.0.0/jquery.min'}});")
        out = shell.display_formatter.format(Javascript(js))[0]["application/javascript"]
        assert "cdnjs" not in out and out.count("data:text/javascript;base64,") == 2
        plain = shell.display_formatter.format(HTML("<b>unchanged</b>"))[0]["text/html"]
        assert plain == "<b>unchanged</b>"
    finally:
        shell.display_formatter.formatters["text/html"].pop(HTML, None)
        shell.display_formatter.formatters["application/javascript"].pop(Javascript, None)


def test_modes(monkeypatch, tmp_path):
    shell = _shell()
    monkeypatch.setenv(bertviz_assets.ASSETS_ENV, "cdn")
    assert notebook.use_vendored_bertviz_assets(shell) == "cdn"
    monkeypatch.setenv(bertviz_assets.ASSETS_ENV, "inline")
    monkeypatch.setenv("BERTLIB_NODE_MODULES", str(tmp_path))
    assert notebook.use_vendored_bertviz_assets(shell) == "missing"
    assert notebook.use_vendored_bertviz_assets(object()) == "no-ipython"
    monkeypatch.setenv(bertviz_assets.ASSETS_ENV, "online")
    with pytest.raises(ValueError, match="BERTLIB_BERTVIZ_ASSETS='online': use one of inline, cdn"):
        notebook.use_vendored_bertviz_assets(shell)


def test_the_book_build_keeps_cdn_urls_for_its_own_rewrite():
    offline = pytest.importorskip("bertbook.offline", reason="the book extras (sphinx) are not installed")
    assert offline.BERTVIZ_ASSETS_ENV == bertviz_assets.ASSETS_ENV
