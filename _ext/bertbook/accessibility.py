"""Accessible pages: what axe-core (WCAG 2 A/AA, the browser test in tests/browser) found in the built book, fixed
where the HTML is written.

- bertviz's ``<select>`` controls (chapters 5 and 7) have a visible "Layer:" text but no accessible name (axe-core
  ``select-name``, critical): :func:`bertlib.course.bertviz_assets.label_controls` gives them an ``aria-label``, the
  same
  patch a live notebook applies (:mod:`bertlib.course.notebook`).
- docutils writes the bibliography as ``<div role="list">`` of entries with the deprecated DPUB role
  ``doc-biblioentry``, which is not a list item (axe-core ``aria-required-children``, critical, and
  ``aria-deprecated-role``): each entry becomes ``role="listitem"``.
- Controls whose ``aria-label`` hides their visible text (axe-core ``label-content-name-mismatch``, WCAG 2.1 2.5.3,
  serious), written by the theme and myst-nb around the body: myst-nb's "Show code cell source" toggles
  (``aria-label="Toggle hidden content"``), pydata-sphinx-theme's search field ("Search Ctrl+K", named "Search") and
  its colour-mode button (icons only): the first two lose the ``aria-label`` (their visible text names them), the
  last gets its name as visually hidden text.

All three are applied to every page the build writes (:func:`fix_written_pages`).
"""

from __future__ import annotations

import re
from pathlib import Path

from sphinx.application import Sphinx

from bertlib.course.bertviz_assets import label_controls

#: (pattern, replacement) for the whole written page: see the module docstring.
_NAME_FIXES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r'<summary aria-label="Toggle hidden content">'), "<summary>"),
    (re.compile(r'(<button class="[^"]*\bsearch-button-field\b[^"]*"[^>]*?) aria-label="[^"]*"'), r"\1"),
    (re.compile(r'(<button class="[^"]*\btheme-switch-button\b[^"]*"[^>]*?) aria-label="([^"]*)"([^>]*>)'),
     r'\1\3<span class="visually-hidden">\2</span>'),
)

_BIBLIOENTRY = re.compile(r"""\brole=(["'])doc-biblioentry\1""")


def citation_list_items(html: str) -> tuple[str, int]:
    """``role="doc-biblioentry"`` → ``role="listitem"``: the children a ``role="list"`` must have. Returns the new
    text and the number of entries changed."""
    return _BIBLIOENTRY.subn(lambda m: f"role={m.group(1)}listitem{m.group(1)}", html)


def visible_names(html: str) -> tuple[str, int]:
    """Give the theme's and myst-nb's controls (module docstring) accessible names that contain their visible text.
    Returns the new text and the number of controls changed."""
    total = 0
    for pattern, replacement in _NAME_FIXES:
        html, n = pattern.subn(replacement, html)
        total += n
    return html, total


def fix_html(html: str) -> tuple[str, int]:
    """Every fix of the module docstring on one page's HTML; returns the new text and the number of changes."""
    total = 0
    for fix in (label_controls, citation_list_items, visible_names):
        html, n = fix(html)
        total += n
    return html, total


def fix_written_pages(app: Sphinx, exception: Exception | None) -> None:
    """build-finished: :func:`fix_html` on every written HTML page (whole pages: the theme's controls are outside
    the body that html-page-context sees)."""
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    for page in sorted(outdir.rglob("*.html")):
        if "_vendor" in page.relative_to(outdir).parts:
            continue
        text = page.read_text(encoding="utf-8")
        fixed, n = fix_html(text)
        if n:
            page.write_text(fixed, encoding="utf-8")
