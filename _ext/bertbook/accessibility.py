"""Accessible pages: what axe-core (WCAG 2 A/AA, the browser test in tests/browser) found in the built book, fixed
where the HTML is written.

- bertviz's ``<select>`` controls (chapters 5 and 7) have a visible "Layer:" text but no accessible name (axe-core
  ``select-name``, critical): :func:`bertlib.bertviz_assets.label_controls` gives them an ``aria-label``, the same
  patch a live notebook applies (:mod:`bertlib.notebook`).
- docutils writes the bibliography as ``<div role="list">`` of entries with the deprecated DPUB role
  ``doc-biblioentry``, which is not a list item (axe-core ``aria-required-children``, critical, and
  ``aria-deprecated-role``): each entry becomes ``role="listitem"``.
"""

from __future__ import annotations

import re
from typing import Any

from sphinx.application import Sphinx

from bertlib.bertviz_assets import label_controls

_BIBLIOENTRY = re.compile(r"""\brole=(["'])doc-biblioentry\1""")


def citation_list_items(html: str) -> tuple[str, int]:
    """``role="doc-biblioentry"`` → ``role="listitem"``: the children a ``role="list"`` must have. Returns the new
    text and the number of entries changed."""
    return _BIBLIOENTRY.subn(lambda m: f"role={m.group(1)}listitem{m.group(1)}", html)


def fix_page(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    """html-page-context: name bertviz's controls and make citation entries list items in the page body."""
    if app.builder.format != "html" or not isinstance(context.get("body"), str):
        return
    body, _ = label_controls(context["body"])
    context["body"], _ = citation_list_items(body)
