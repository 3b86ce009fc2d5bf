"""A static picture beside every bertviz view, for a reader whose browser runs no JavaScript.

bertviz's ``head_view``, ``model_view`` and ``neuron_view`` (chapters 5 and 7) draw with JavaScript; without it the
page showed only their empty "Layer: Head:" controls. At ``html-page-context`` each view's embedded attention
(:func:`bertlib.course.bertviz_assets.view_params`) is drawn as heat maps
(:func:`bertlib.course.bertviz_assets.static_picture`) into ``_images/bertviz/<view id>.png``, and a ``<noscript>``
before the view shows it, with a sentence that says what it is, and hides the dead controls. A browser that runs
scripts ignores the ``<noscript>`` (the interactive view is the figure); the notebooks are untouched.
"""

from __future__ import annotations

import html as html_lib
import re
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

from bertlib.course.bertviz_assets import static_picture, view_params

from .offline import _prefix

logger = logging.getLogger(__name__)

IMAGES = "_images/bertviz"


def fallback(root_id: str, src: str, text: str) -> str:
    """The ``<noscript>`` put before the view ``root_id``: the picture at ``src`` and ``text`` as its alt text and
    caption; it hides the view's controls, which need JavaScript."""
    alt = html_lib.escape(text, quote=True)
    return (f'<noscript><style>#{root_id} {{ display: none; }}</style>'
            f'<figure class="bertviz-static"><img src="{src}" alt="{alt}" style="max-width: 100%; height: auto;">'
            f"<figcaption>JavaScript is off, so the interactive view is not drawn. {html_lib.escape(text)}"
            "</figcaption></figure></noscript>")


def add_fallbacks(body: str, outdir: Path, prefix: str) -> tuple[str, int]:
    """Put a static picture (:func:`fallback`) before every bertviz view in ``body``, writing the PNGs under
    ``outdir``/``IMAGES``; ``prefix`` leads from the page back to the output root. Returns the new body and the
    number of views given one."""
    added = 0
    for params in view_params(body):
        root_id = params["root_div_id"]
        if not re.fullmatch(r"bertviz-[0-9a-f]+", root_id):
            continue
        container = re.compile(rf"<div id=([\"']?){root_id}\1[\s>]")
        m = container.search(body)
        if m is None or f"#{root_id} {{ display: none; }}" in body:
            continue
        png, text = static_picture(params)
        path = outdir / IMAGES / f"{root_id}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(png)
        body = body[: m.start()] + fallback(root_id, f"{prefix}{IMAGES}/{root_id}.png", text) + body[m.start():]
        added += 1
    return body, added


def add_static_pictures(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    """html-page-context: :func:`add_fallbacks` on the page's body."""
    if app.builder.format != "html" or "bertviz" not in (context.get("body") or ""):
        return
    context["body"], n = add_fallbacks(context["body"], Path(app.outdir), _prefix(context))
    if n:
        logger.info(f"bertbook: {pagename}: a static picture for {n} bertviz view(s)")
