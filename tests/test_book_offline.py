"""The offline HTML machinery of _ext/bertbook, without building the book: the CDN URLs bertviz really writes are
all rewritten to the vendored copies, the scanner finds every kind of external load (and no plain link), and the
npm pins agree with the lock file. The browser tests (tests/browser) check the built pages themselves."""

from __future__ import annotations

import json

import pytest
import torch

from toc import ROOT

offline = pytest.importorskip("bertbook.offline", reason="the book extras (sphinx) are not installed")


def _bertviz_html(view: str, sentence_b: bool = False) -> str:
    """The HTML bertviz itself emits for a small attention tensor (so a new bertviz CDN URL is caught here);
    ``sentence_b``: a sentence pair, for which bertviz adds its "Attention:" filter control."""
    bertviz = pytest.importorskip("bertviz")
    g = torch.Generator().manual_seed(0)
    layers, heads, seq = 2, 3, 4
    attention = tuple(torch.softmax(torch.randn(1, heads, seq, seq, generator=g), -1) for _ in range(layers))
    tokens = ["[CLS]", "hello", "[SEP]", "world"]
    html = getattr(bertviz, view)(attention, tokens, sentence_b_start=3 if sentence_b else None,
                                  html_action="return")
    return html.data


@pytest.mark.parametrize("view", ["head_view", "model_view"])
def test_every_cdn_url_bertviz_writes_is_rewritten(view):
    raw = _bertviz_html(view)
    assert offline.external_resources(raw), f"bertviz {view} loads nothing from a CDN any more: update bertbook"
    html, n = offline.rewrite_cdn_urls(raw, "../")
    assert n >= 3, f"only {n} CDN URLs rewritten in bertviz {view}"
    assert offline.external_resources(html) == [], offline.external_resources(html)
    for path in ("../_vendor/requirejs/require.js", "'../_vendor/d3/d3.min'", "'../_vendor/jquery/jquery.min'"):
        assert path in html, f"{path} missing after the rewrite"


@pytest.mark.parametrize("view, sentence_b", [("head_view", False), ("head_view", True), ("model_view", True)])
def test_bertviz_controls_get_accessible_names(view, sentence_b):
    """Every <select> bertviz writes gets an aria-label (axe-core's select-name rule, WCAG 4.1.2), once."""
    import re

    from bertlib.course.bertviz_assets import CONTROL_LABELS, label_controls

    raw = _bertviz_html(view, sentence_b)
    selects = re.findall(r"<select\b[^>]*>", raw)
    assert selects and not any("aria-label" in s for s in selects), f"bertviz {view} labels its controls now"
    html, n = label_controls(raw)
    labelled = re.findall(r"<select\b[^>]*>", html)
    assert n == len(selects) and all(re.search(r'aria-label="[^"]+"', s) for s in labelled), labelled
    assert {re.search(r'id="(\w+)"', s).group(1) for s in labelled} <= set(CONTROL_LABELS)
    assert label_controls(html) == (html, 0)  # labelled once


def test_citation_entries_become_list_items():
    """docutils' bibliography: a role="list" whose entries carry the deprecated doc-biblioentry role (axe-core
    aria-required-children, critical) gets role="listitem" entries; nothing else changes."""
    accessibility = pytest.importorskip("bertbook.accessibility")
    page = ('<div role="list" class="citation-list">\n<div class="citation" id="id1" role="doc-biblioentry">A</div>'
            "<div class='citation' role='doc-biblioentry'>B</div></div><p>role=&quot;doc-biblioentry&quot; in text</p>")
    html, n = accessibility.citation_list_items(page)
    assert n == 2 and html.count('role="listitem"') == 1 and html.count("role='listitem'") == 1
    assert "role=&quot;doc-biblioentry&quot; in text" in html  # text on the page (escaped), not an attribute


def test_controls_named_by_their_visible_text():
    """The theme's and myst-nb's controls whose aria-label hid their visible text (axe-core
    label-content-name-mismatch) are named by it; an icon-only button keeps its label as hidden text."""
    accessibility = pytest.importorskip("bertbook.accessibility")
    page = ('<summary aria-label="Toggle hidden content">\n<p>Show code cell source</p></summary>'
            '<button class="btn search-button-field search-button__button" title="Search" aria-label="Search" '
            'data-bs-toggle="tooltip"><span>Search</span><kbd>Ctrl</kbd>+<kbd>K</kbd></button>'
            '<button class="btn btn-sm nav-link theme-switch-button" aria-label="Color mode" data-bs-title="C">'
            '<i class="theme-switch fa-sun"></i></button>'
            '<button class="btn btn-sm search-button search-button__button" aria-label="Search"><i></i></button>')
    html, n = accessibility.visible_names(page)
    assert n == 3 and "<summary>" in html and 'aria-label="Color mode"' not in html
    assert '<span class="visually-hidden">Color mode</span><i class="theme-switch' in html
    assert html.count('aria-label="Search"') == 1  # the icon-only search button keeps its name
    assert accessibility.visible_names(html) == (html, 0)


def test_every_written_page_is_fixed(tmp_path):
    """build-finished: each written page gets every fix (bertviz's controls, citations, visible names); _vendor/
    is left alone."""
    from types import SimpleNamespace

    accessibility = pytest.importorskip("bertbook.accessibility")
    page = ('<select id="layer"></select><div role="list"><div role="doc-biblioentry">A</div></div>'
            '<summary aria-label="Toggle hidden content"><p>Show code cell source</p></summary>')
    (tmp_path / "chapters").mkdir()
    (tmp_path / "_vendor").mkdir()
    for path in (tmp_path / "chapters" / "a.html", tmp_path / "_vendor" / "b.html"):
        path.write_text(page, encoding="utf-8")
    app = SimpleNamespace(outdir=str(tmp_path), builder=SimpleNamespace(format="html"))
    accessibility.fix_written_pages(app, None)
    fixed = (tmp_path / "chapters" / "a.html").read_text(encoding="utf-8")
    assert fixed == accessibility.fix_html(page)[0] != page
    assert 'aria-label="Layer"' in fixed and 'role="listitem"' in fixed and "<summary>" in fixed
    assert (tmp_path / "_vendor" / "b.html").read_text(encoding="utf-8") == page


def test_mathjax_cdn_url_is_rewritten():
    html, n = offline.rewrite_cdn_urls('<script defer src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js">'
                                       "</script>", "")
    assert n == 1 and 'src="_vendor/mathjax/tex-mml-chtml.js"' in html


def test_scanner_finds_loads_and_ignores_links():
    page = """
    <script src="https://cdn.example.org/a.js"></script>
    <script src="//cdn.example.org/protocol-relative.js"></script>
    <img alt="x" src="http://img.example.org/b.png">
    <link rel="stylesheet" href="https://fonts.example.org/c.css">
    <link rel="canonical" href="https://example.org/page.html">
    <style>@import url("https://fonts.example.org/d.css");</style>
    <script>require.config({paths: {d3: 'https://cdnjs.example.org/d3.min'}});</script>
    <a href="https://arxiv.org/abs/1810.04805">a paper</a>
    <script src="../_static/local.js"></script>
    <pre>&lt;script src="https://in.a.code.block/x.js"&gt;</pre>
    """
    assert sorted(offline.external_resources(page)) == sorted([
        "https://cdn.example.org/a.js", "//cdn.example.org/protocol-relative.js", "http://img.example.org/b.png",
        "https://fonts.example.org/c.css", "https://fonts.example.org/d.css", "https://cdnjs.example.org/d3.min"])


def test_npm_pins_match_the_lock_file_and_the_vendored_files():
    package = json.loads((ROOT / "package.json").read_text())
    lock = json.loads((ROOT / "package-lock.json").read_text())
    pins = package["dependencies"] | package.get("devDependencies", {})
    assert {"requirejs", "d3", "jquery", "mathjax"} <= set(package["dependencies"]), pins
    assert "axe-core" in package["devDependencies"], "the browser test's accessibility check (tests/browser)"
    for name, version in pins.items():
        assert lock["packages"][f"node_modules/{name}"]["version"] == version, f"package-lock.json is stale for {name}"
    vendored_packages = {src.split("/")[0] for src in offline.FILES} | {offline.MATHJAX_SRC.split("/")[0]}
    assert vendored_packages <= set(pins), f"vendored but not pinned: {vendored_packages - set(pins)}"
