"""bertviz views in a live notebook, offline: require.js, d3 and jQuery from the repository's npm copies.

bertviz's ``head_view``, ``model_view`` and ``neuron_view`` (chapters 5 and 7) write HTML and JavaScript that load
require.js, d3 and jQuery from cdnjs, so behind a firewall (a classroom, a plane) the views stay blank. The HTML book
serves its own copies (``_ext/bertbook/offline.py``); in a live notebook (JupyterLab, ``make lab``)
:func:`use_vendored_bertviz_assets`, which :func:`bertlib.course.setup` calls, registers IPython display formatters that
rewrite those outputs: require.js goes inline into the page, and d3 and jQuery become ``data:`` URLs in bertviz's
``require.config`` paths, read from ``node_modules/`` (``npm ci`` installs the versions pinned in
``package-lock.json``; ``make lab`` runs it). No request leaves the notebook server. Which files and which CDN
URLs: :mod:`bertlib.course.bertviz_assets`, shared with the book build.

``BERTLIB_BERTVIZ_ASSETS=cdn`` leaves bertviz's outputs as they are: the book build and the nbval run that fills its
execution cache set it, since the book rewrites the CDN URLs to its own copies (a 0.5 MB inline copy per view
would only make its pages heavier). ``BERTLIB_NODE_MODULES`` points at another ``node_modules`` folder.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import Any

from bertlib.course.bertviz_assets import ASSETS_ENV, CDN_URLS, NPM_FILES, cdn_pattern, label_controls, node_modules_dir

__all__ = ["FILES", "MODES", "inline_assets", "use_vendored_bertviz_assets", "vendored_assets"]

MODES = ("inline", "cdn")
#: The npm files (under node_modules) that replace the CDN copies: the versions package-lock.json pins.
FILES = NPM_FILES

# What bertviz 1.4 writes: a <script src=...require.min.js> tag and require.config paths without ".js".
_REQUIRE_TAG = re.compile(rf"<script\s+src=[\"']{CDN_URLS['require']}[\"']\s*>\s*</script>")
_PATHS = {name: cdn_pattern(name, quoted=True) for name in ("d3", "jquery")}


def vendored_assets(node_modules: Path | None = None) -> dict[str, str] | None:
    """The text of require.js, d3 and jQuery from ``node_modules``, or None when any of them is missing."""
    root = node_modules_dir() if node_modules is None else Path(node_modules)
    paths = {name: root / rel for name, rel in FILES.items()}
    if not all(p.is_file() for p in paths.values()):
        return None
    return {name: p.read_text(encoding="utf-8") for name, p in paths.items()}


def inline_assets(text: str, assets: dict[str, str]) -> tuple[str, int]:
    """Replace bertviz's CDN require.js tag with the inline script and its d3/jQuery ``require.config`` paths with
    ``data:`` URLs (require.js loads a ``data:`` path as it is, without adding ".js"). Returns the new text and the
    number of replacements."""
    script = assets["require"].replace("</script", "<\\/script")
    text, total = _REQUIRE_TAG.subn(lambda _: f"<script>{script}</script>", text)
    for name, pattern in _PATHS.items():
        url = "data:text/javascript;base64," + base64.b64encode(assets[name].encode("utf-8")).decode("ascii")
        text, n = pattern.subn(lambda m, url=url: f"{m.group(1)}{url}{m.group(1)}", text)
        total += n
    return text, total


def _printer(method: str, assets: dict[str, str]):
    def printer(obj: Any) -> Any:
        out = getattr(obj, method)()
        data, metadata = out if isinstance(out, tuple) else (out, None)
        if isinstance(data, str):
            data, _ = inline_assets(data, assets)
            data, _ = label_controls(data)  # bertviz's <select>s get accessible names
        return data if metadata is None else (data, metadata)

    return printer


def use_vendored_bertviz_assets(shell: Any = None) -> str:
    """In an IPython kernel, make bertviz views load require.js, d3 and jQuery from ``node_modules`` instead of the
    CDNs (see the module docstring). Returns what it did: ``"inline"``, ``"cdn"`` (asked for by
    ``$BERTLIB_BERTVIZ_ASSETS``), ``"missing"`` (no vendored copies: the views need the network) or
    ``"no-ipython"`` (plain Python: nothing to display)."""
    mode = os.environ.get(ASSETS_ENV, "inline").strip().lower() or "inline"
    if mode not in MODES:
        raise ValueError(f"{ASSETS_ENV}={mode!r}: use one of {', '.join(MODES)} (inline: bertviz views load "
                         "require.js, d3 and jQuery from node_modules/; cdn: from the CDNs, as bertviz writes them).")
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return "no-ipython"
        shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return "no-ipython"
    if mode == "cdn":
        return "cdn"
    assets = vendored_assets()
    if assets is None:
        return "missing"
    from IPython.display import HTML, Javascript

    formatters = shell.display_formatter.formatters
    formatters["text/html"].for_type(HTML, _printer("_repr_html_", assets))
    formatters["application/javascript"].for_type(Javascript, _printer("_repr_javascript_", assets))
    return "inline"
