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


# --------------------------------------------------------------- a static picture for a page read without JavaScript

def _view_html(view: str, layers: int = 2, heads: int = 3) -> str:
    g = torch.Generator().manual_seed(0)
    attention = [torch.rand(1, heads, 4, 4, generator=g).softmax(-1) for _ in range(layers)]
    return getattr(bertviz, view)(attention, ["[CLS]", "a", "b", "[SEP]"], html_action="return").data


def _neuron_html() -> str:
    """What bertviz's neuron_view writes (its params, as ``window.bertviz_params``), for a small attention."""
    import json

    attn = torch.rand(2, 3, 4, 4, generator=torch.Generator().manual_seed(1)).softmax(-1).tolist()
    tokens = ["[CLS]", "a", "b", "[SEP]"]
    params = {"attention": {"all": {"attn": attn, "left_text": tokens, "right_text": tokens}},
              "default_filter": "all", "root_div_id": "bertviz-0123abcd", "bidirectional": True,
              "display_mode": "light", "layer": 1, "head": 2}
    return ('<div id=bertviz-0123abcd style="padding:8px"><select id="layer"></select></div>'
            f"<script>window.bertviz_params = {json.dumps(params)}</script>")


def test_view_params_are_read_from_every_kind_of_view():
    found = [p for html in (_view_html("head_view"), _view_html("model_view"), _neuron_html())
             for p in bertviz_assets.view_params(html)]
    assert [p["kind"] for p in found] == ["head", "model", "neuron"]
    assert all(p["root_div_id"].startswith("bertviz-") for p in found)
    assert bertviz_assets.view_params("<script>const params = PYTHON_PARAMS;</script>") == []


@pytest.mark.parametrize("view", ["head_view", "model_view", "neuron_view"])
def test_static_picture_shows_the_views_attention(view):
    from io import BytesIO

    from PIL import Image

    html = _neuron_html() if view == "neuron_view" else _view_html(view)
    params = bertviz_assets.view_params(html)[0]
    png, text = bertviz_assets.static_picture(params)
    image = Image.open(BytesIO(png))
    assert image.format == "PNG" and image.width >= 200 and image.height >= 150
    assert "Tokens: [CLS] a b [SEP]." in text
    shown = {"head_view": "every head of layer 0", "model_view": "every head of layers 0 to 1",
             "neuron_view": "layer 1, head 2: a heat map"}[view]
    assert shown in text, text
    # the panels are the view's heads: a picture of other numbers differs
    other = dict(params, attention=[dict(params["attention"][0], attn=(torch.tensor(params["attention"][0]["attn"])
                                                                          .flip(-1).tolist()))]) \
        if view != "neuron_view" else dict(params, head=0)
    assert bertviz_assets.static_picture(other)[0] != png


def test_the_book_puts_the_picture_before_each_view(tmp_path):
    static_views = pytest.importorskip("bertbook.static_views", reason="the book extras (sphinx) are not installed")
    body = _view_html("head_view") + "<p>between</p>" + _view_html("model_view") + _neuron_html()
    new, n = static_views.add_fallbacks(body, tmp_path, "../")
    assert n == 3
    for params in bertviz_assets.view_params(body):
        root = params["root_div_id"]
        png = tmp_path / static_views.IMAGES / f"{root}.png"
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        fallback = new.index(f"<noscript><style>#{root} {{ display: none; }}</style>")
        assert fallback < re.search(rf"<div id=[\"']?{root}", new).start()       # just before the view
        assert f'src="../{static_views.IMAGES}/{root}.png" alt="A static picture' in new
    assert new.count("<noscript>") == 3 and static_views.add_fallbacks(new, tmp_path, "../") == (new, 0)
