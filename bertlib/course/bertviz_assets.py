"""The JavaScript bertviz's views load, served from npm copies instead of CDNs: one definition of the files and of
the CDN URLs, read by a live notebook (:mod:`bertlib.course.notebook`) and by the book build
(``_ext/bertbook/offline.py``).

bertviz's ``head_view``, ``model_view`` and ``neuron_view`` write a ``<script src=...>`` for require.js and a
``require.config`` whose ``paths`` name d3 and jQuery on cdnjs (without ``.js``: require.js adds it). ``npm ci``
installs the versions ``package.json`` pins and ``package-lock.json`` locks into ``node_modules/``
(:data:`NPM_CI`: ``--ignore-scripts``, so no package runs code at install time).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from bertlib.data.files import project_path

#: ``inline`` (a live notebook: bertlib inlines its npm copies into each view) or ``cdn`` (the book build and the
#: nbval run that fills its cache: the CDN URLs stay in the outputs, and the book rewrites them to its own copies).
ASSETS_ENV = "BERTLIB_BERTVIZ_ASSETS"
#: Another ``node_modules`` folder than the repository's.
NODE_MODULES_ENV = "BERTLIB_NODE_MODULES"

#: Each asset's file under ``node_modules``: the versions package-lock.json pins.
NPM_FILES: dict[str, str] = {
    "require": "requirejs/require.js",
    "d3": "d3/dist/d3.min.js",
    "jquery": "jquery/dist/jquery.min.js",
}

#: The CDN URLs bertviz's outputs load each asset from (regular expressions): require.js in a ``<script src>``,
#: d3 and jQuery as ``require.config`` paths, where ``.js`` is usually left out.
CDN_URLS: dict[str, str] = {
    "require": (r"https?://(?:cdnjs\.cloudflare\.com/ajax/libs/require\.js/[\w.\-]+/require"
                r"|cdn\.jsdelivr\.net/npm/requirejs@[\w.\-]+/require)(?:\.min)?\.js"),
    "d3": r"https?://cdnjs\.cloudflare\.com/ajax/libs/d3/[\w.\-]+/d3(?:\.min)?(?:\.js)?",
    "jquery": r"https?://cdnjs\.cloudflare\.com/ajax/libs/jquery/[\w.\-]+/jquery(?:\.min)?(?:\.js)?",
}

#: How the npm copies are installed: exactly the lock file's versions, and no install scripts.
NPM_CI: tuple[str, ...] = ("npm", "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error")


def cdn_pattern(asset: str, quoted: bool = False) -> re.Pattern[str]:
    """:data:`CDN_URLS` ``[asset]`` compiled; ``quoted``: inside quotes (a ``require.config`` path), the quote
    captured as group 1 so a replacement can put it back."""
    url = CDN_URLS[asset]
    return re.compile(rf"([\"']){url}\1" if quoted else url)


def node_modules_dir() -> Path:
    """Where a live notebook reads the npm copies: ``$BERTLIB_NODE_MODULES``, else ``node_modules/`` at the
    repository root (:func:`bertlib.data.files.project_path`; the book build reads its own root's)."""
    return Path(os.environ.get(NODE_MODULES_ENV) or project_path("node_modules"))


#: bertviz's ``<select>`` controls (by id) and the accessible name each gets. bertviz writes a visible "Layer:" or
#: "Head:" text beside each, not a ``<label>``, so a screen reader announces an unnamed list box (axe-core's
#: ``select-name`` rule, WCAG 2 4.1.2, critical). The name is the visible text, as WCAG 2.5.3 asks.
CONTROL_LABELS: dict[str, str] = {"layer": "Layer", "att_head": "Head", "filter": "Attention"}

_UNLABELLED_SELECT = re.compile(r"<select(\s+)id=([\"'])(" + "|".join(CONTROL_LABELS) + r")\2(?![^>]*\baria-label)")


def label_controls(html: str) -> tuple[str, int]:
    """Give bertviz's ``<select>`` controls (:data:`CONTROL_LABELS`) an ``aria-label`` where they have none.
    Returns the new text and the number of controls labelled. Applied by the book build to every page
    (``_ext/bertbook/accessibility.py``) and by a live notebook to every bertviz view
    (:mod:`bertlib.course.notebook`)."""
    return _UNLABELLED_SELECT.subn(
        lambda m: f'<select{m.group(1)}id={m.group(2)}{m.group(3)}{m.group(2)} '
                  f'aria-label="{CONTROL_LABELS[m.group(3)]}"', html)
