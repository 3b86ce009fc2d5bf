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


# --- A static picture of a view, for a page read without JavaScript ----------------------------------------------
# bertviz draws with JavaScript. A reader of the HTML book without it (a text browser, scripts blocked, a page saved
# as text) saw only the empty "Layer: Head:" controls. The book build (``_ext/bertbook/static_views.py``) reads the
# attention each view embeds in the page and puts this picture of it in a <noscript> beside the view.

_PARAMS = re.compile(r"(?:const params|window\.bertviz_params)\s*=\s*")


def view_params(html: str) -> list[dict]:
    """The parameters (attention, tokens, chosen layer and head) of every bertviz view whose script is in ``html``:
    ``head_view`` and ``model_view`` write ``const params = {...}``, ``neuron_view`` ``window.bertviz_params = {...}``
    (both JSON). Each dict gains ``"kind"``: ``"head"``, ``"model"`` or ``"neuron"``."""
    import json

    decoder, found = json.JSONDecoder(), []
    for m in _PARAMS.finditer(html):
        try:
            params, _ = decoder.raw_decode(html, m.end())
        except json.JSONDecodeError:     # the template marker (PYTHON_PARAMS) or another script's object
            continue
        if not (isinstance(params, dict) and "root_div_id" in params and params.get("attention")):
            continue
        if isinstance(params["attention"], dict):
            kind = "neuron"
        else:
            kind = "model" if "include_heads" in params else "head"
        found.append(dict(params, kind=kind))
    return found


def _panels(params: dict) -> tuple[list, list[str], list[str], list[tuple[int, int]], str]:
    """(attention matrices, query tokens, key tokens, (layer, head) of each panel, what is shown) of one view."""
    if params["kind"] == "neuron":
        view = params["attention"].get("all") or next(iter(params["attention"].values()))
        layer, head = params.get("layer") or 0, params.get("head") or 0
        return ([view["attn"][layer][head]], view["left_text"], view["right_text"], [(layer, head)],
                f"layer {layer}, head {head}")
    view = params["attention"][0]
    layers = params.get("include_layers") or list(range(len(view["attn"])))
    if params["kind"] == "model":
        heads = params.get("include_heads") or list(range(len(view["attn"][0])))
        cells = [(i, j) for i in range(len(layers)) for j in range(len(heads))]
        return ([view["attn"][i][j] for i, j in cells], view["left_text"], view["right_text"],
                [(layers[i], heads[j]) for i, j in cells], f"every head of layers {layers[0]} to {layers[-1]}")
    i = layers.index(params["layer"]) if params.get("layer") in layers else 0
    heads = params.get("heads") or list(range(len(view["attn"][i])))
    return ([view["attn"][i][h] for h in heads], view["left_text"], view["right_text"], [(layers[i], h) for h in heads],
            f"every head of layer {layers[i]}")


def static_picture(params: dict, dpi: int = 80) -> tuple[bytes, str]:
    """A PNG of the attention a bertviz view shows (one heat map per head: row = query token, column = key token,
    darker = more attention; a ``model_view`` as a grid of layers by heads, like the view itself) and a sentence
    that describes it, for the image's alt text. ``params``: one entry of :func:`view_params`."""
    import io
    import textwrap

    import numpy as np
    from matplotlib.figure import Figure

    mats, left, right, where, shown = _panels(params)
    n = len(mats)
    layers = sorted({layer for layer, _ in where})
    cols = n // len(layers) if params["kind"] == "model" else min(n, 6)
    rows = -(-n // cols)
    labelled = n <= 12                   # token names fit on the panels of one layer, not on a grid of every layer
    size = (4.0 if n == 1 else 2.4) if labelled else 0.75
    width = cols * size + 1.2 * labelled
    fig = Figure(figsize=(width, rows * (size + 0.3 + 0.5 * labelled) + 0.8), dpi=dpi)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, mat, (layer, head) in zip(axes[:n], mats, where, strict=True):
        ax.imshow(np.asarray(mat, dtype=float), cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(f"layer {layer}, head {head}" if labelled else f"L{layer} H{head}", fontsize=9 if labelled else 7)
    if labelled:
        for k, ax in enumerate(axes[:n]):
            if k % cols == 0:
                ax.set_yticks(range(len(left)), left, fontsize=7)
            if k >= n - cols:
                ax.set_xticks(range(len(right)), right, fontsize=7, rotation=90)
    for ax in axes[n:]:
        ax.set_axis_off()
    title = f"Attention, {shown} (row: query token, column: key token; darker: more attention)"
    fig.suptitle(textwrap.fill(title, width=max(30, int(width * 11))), fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    maps = "a heat map" if n == 1 else "one heat map per head"
    text = (f"A static picture of the same attention, {shown}: {maps}, in which row i, column j is how much token i "
            f"attends to token j (darker is more). Tokens: {' '.join(left)}.")
    return buf.getvalue(), text
