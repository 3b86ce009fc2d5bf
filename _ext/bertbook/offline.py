"""Offline-complete HTML: serve require.js, d3, jQuery and MathJax from the book itself.

The assets come from the npm registry at build time (``package.json`` + ``package-lock.json``, ``npm ci
--ignore-scripts``) and are copied to ``<outdir>/_vendor/``, *not* ``_static/``: Jupyter Book 1 injects every
``*.js`` of ``_static`` into every page, and a require.js loaded before MathJax breaks it ("Mismatched anonymous
define() module"). Which files, and the CDN URLs bertviz writes, are :mod:`bertlib.course.bertviz_assets`, shared with a
live notebook (``bertlib/course/notebook.py``).

MathJax is pointed at its vendored copy through Sphinx's public ``mathjax_path`` setting (``config-inited``); at
``html-page-context`` the CDN URLs that bertviz's outputs (require.js, and the d3/jQuery ``require.config`` paths)
put in a page are rewritten to the vendored copies, relative to the page. Any external
script, stylesheet, image or frame left in a page afterwards is a warning (an error under ``-W``), checked both
in the page context and in the written HTML files.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx
from sphinx.util import logging

from bertlib.course.bertviz_assets import ASSETS_ENV, CDN_URLS, NPM_CI, NPM_FILES

logger = logging.getLogger(__name__)

VENDOR = "_vendor"
#: Kernels started by the build (and by the nbval run that fills its cache) get ``BERTLIB_BERTVIZ_ASSETS=cdn``: bertlib
#: then leaves bertviz's CDN URLs in the outputs for :func:`rewrite_page`, instead of inlining its own copies of
#: require.js, d3 and jQuery into every view as it does in a live notebook (``bertlib/course/notebook.py``).
BERTVIZ_ASSETS_ENV = ASSETS_ENV

#: Where each of bertviz's assets goes under _vendor/ (its npm file and CDN URLs: bertlib.course.bertviz_assets).
_VENDORED = {"require": "requirejs/require.js", "d3": "d3/d3.min.js", "jquery": "jquery/jquery.min.js"}
#: npm file (relative to node_modules) -> file under _vendor/.
FILES = {NPM_FILES[name]: dest for name, dest in _VENDORED.items()}
MATHJAX_SRC = "mathjax/es5"
MATHJAX_DEST = "mathjax"
MATHJAX_ENTRY = "mathjax/tex-mml-chtml.js"
#: Parts of MathJax's es5 tree the book never loads (other combined bundles, the SVG output, the node build).
_MATHJAX_SKIP = re.compile(r"^(tex-chtml.*|tex-svg.*|tex-mml-svg\.js|mml-.*\.js|node-main\.js|output/svg.*)$")

#: CDN URL -> vendored path (relative to the output root), any version. require.config paths (d3, jQuery) are given
#: without ".js" (require adds it).
_REWRITES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(CDN_URLS["require"]), f"{VENDOR}/{_VENDORED['require']}"),
    (re.compile(CDN_URLS["d3"] + r"(?=['\"])"), f"{VENDOR}/{_VENDORED['d3'].removesuffix('.js')}"),
    (re.compile(CDN_URLS["jquery"] + r"(?=['\"])"), f"{VENDOR}/{_VENDORED['jquery'].removesuffix('.js')}"),
    (re.compile(r"https?://cdn\.jsdelivr\.net/npm/mathjax@[\w.\-]+/es5/tex-mml-chtml\.js"), "_vendor/" + MATHJAX_ENTRY),
]

# What makes a browser fetch something: src= on these tags, href= on resource <link>s, url() in CSS,
# http(s) paths in a require.config({paths: ...}) block.
_SRC_TAG = re.compile(r"<(script|img|iframe|embed|source|video|audio|track|input)\b[^>]*?"
                      r"\bsrc\s*=\s*[\"']?((?:https?:)?//[^\"'\s>]+)",
                      re.IGNORECASE)
_LINK_TAG = re.compile(r"<link\b[^>]*>", re.IGNORECASE)
_LINK_REL = re.compile(r"\brel\s*=\s*[\"']?([^\"'>]+)", re.IGNORECASE)
_LINK_HREF = re.compile(r"\bhref\s*=\s*[\"']?((?:https?:)?//[^\"'\s>]+)", re.IGNORECASE)
_RESOURCE_RELS = {"stylesheet", "preload", "prefetch", "modulepreload", "icon", "manifest", "apple-touch-icon"}
_CSS_URL = re.compile(r"(?:@import\s+|url\()\s*[\"']?((?:https?:)?//[^\"')\s]+)", re.IGNORECASE)
_STYLE_BLOCK = re.compile(r"<style\b[^>]*>(.*?)</style>", re.IGNORECASE | re.DOTALL)
_REQUIRE_PATHS = re.compile(r"\bpaths\s*:\s*\{([^}]*)\}", re.DOTALL)
_URL = re.compile(r"[\"']((?:https?:)?//[^\"']+)[\"']")


def external_resources(html: str) -> list[str]:
    """Every URL outside the page's own origin that ``html`` makes a browser load (scripts, styles, images,
    frames, ``require.config`` paths). Links a reader may click (``<a href>``) are not loads and are not listed."""
    found = [m.group(2) for m in _SRC_TAG.finditer(html)]
    for tag in _LINK_TAG.findall(html):
        rel = _LINK_REL.search(tag)
        href = _LINK_HREF.search(tag)
        if href and rel and _RESOURCE_RELS & set(rel.group(1).lower().split()):
            found.append(href.group(1))
    for block in _STYLE_BLOCK.findall(html):
        found += _CSS_URL.findall(block)
    for block in _REQUIRE_PATHS.findall(html):
        found += _URL.findall(block)
    return found


def rewrite_cdn_urls(text: str, prefix: str) -> tuple[str, int]:
    """Replace the CDN URLs in ``text`` with vendored paths under ``prefix`` (the page's way up to the output
    root, e.g. ``"../"``). Returns the new text and the number of replacements."""
    total = 0
    for pattern, target in _REWRITES:
        text, n = pattern.subn(prefix + target, text)
        total += n
    return text, total


# --------------------------------------------------------------------------------------------------- npm

def _node_modules(app: Sphinx) -> Path:
    return Path(app.confdir) / "node_modules"


def ensure_npm_assets(app: Sphinx) -> Path:
    """Run ``npm ci --ignore-scripts`` in the book root when ``node_modules`` is missing or older than
    ``package-lock.json``; return the ``node_modules`` folder. Raises a clear error if npm is needed and absent."""
    root = Path(app.confdir)
    lock, modules = root / "package-lock.json", _node_modules(app)
    if not lock.exists():
        raise FileNotFoundError(
            f"{lock} is missing: the book's browser assets are pinned there (run `npm install` once).")
    marker = modules / ".package-lock.json"  # npm writes this hidden lockfile on every install
    if (marker.exists() and marker.stat().st_mtime >= lock.stat().st_mtime
            and all((modules / f).exists() for f in FILES)):
        return modules
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("the HTML book serves its own require.js, d3, jQuery and MathJax, installed from npm: "
                           "install Node.js and npm (Debian/Ubuntu: sudo apt-get install -y nodejs npm; macOS: brew "
                           "install node; or https://nodejs.org), then build again.")
    logger.info(f"bertbook: {' '.join(NPM_CI)} (browser assets from package-lock.json)")
    proc = subprocess.run([npm, *NPM_CI[1:]], cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(NPM_CI)}` failed in {root} (exit {proc.returncode}):\n{proc.stdout}\n"
                           f"{proc.stderr}")
    return modules


def copy_assets(app: Sphinx) -> None:
    """builder-inited: install the npm assets and copy them to ``<outdir>/_vendor`` (before pages are written,
    so Sphinx can checksum the MathJax script). Kernels this build starts leave bertviz's CDN URLs for the rewrite."""
    os.environ.setdefault(BERTVIZ_ASSETS_ENV, "cdn")
    if app.builder.format != "html":
        return
    modules = ensure_npm_assets(app)
    dest = Path(app.outdir) / VENDOR
    for src, rel in FILES.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(modules / src, target)
    mj_src, mj_dest = modules / MATHJAX_SRC, dest / MATHJAX_DEST
    for path in sorted(mj_src.rglob("*")):
        rel = path.relative_to(mj_src).as_posix()
        if path.is_dir() or _MATHJAX_SKIP.match(rel):
            continue
        target = mj_dest / rel
        if not target.exists() or target.stat().st_size != path.stat().st_size:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
    versions = {name: json.loads((modules / name / "package.json").read_text())["version"]
                for name in ("requirejs", "d3", "jquery", "mathjax")}
    (dest / "VERSIONS.json").write_text(json.dumps(versions, indent=1, sort_keys=True) + "\n")
    logger.info(f"bertbook: vendored {versions} into {dest}")


# --------------------------------------------------------------------------------------------------- pages

def _prefix(context: dict[str, Any]) -> str:
    """'../' * depth: the page's relative way back to the output root."""
    up = context["pathto"]("index")  # e.g. "../index.html" or "index.html"
    return up[: -len("index.html")] if up.endswith("index.html") else ""


def use_vendored_mathjax(app: Sphinx, config: Any) -> None:
    """config-inited: point ``mathjax_path`` (a public ``sphinx.ext.mathjax`` setting) at the vendored MathJax, so
    no page ever names the CDN. Sphinx puts a relative path under ``_static/``, hence the ``../``."""
    config.mathjax_path = f"../{VENDOR}/{MATHJAX_ENTRY}"


def rewrite_page(app: Sphinx, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    """html-page-context: point bertviz's outputs at the vendored copies (MathJax already is:
    :func:`use_vendored_mathjax`), drop duplicate inline scripts, and warn about any external resource left."""
    if app.builder.format != "html":
        return
    prefix = _prefix(context)
    if not context.get("default_mode"):
        # pydata-sphinx-theme logs a console error ("Got invalid theme mode") when no mode is set
        context["default_mode"] = "auto"
    scripts, inline_seen = [], set()
    for js in context.get("script_files", []):
        filename = os.fspath(getattr(js, "filename", js) or "")
        attributes = getattr(js, "attributes", None)
        if isinstance(attributes, dict) and not filename:
            # sphinx-thebe's `const THEBE_JS_URL = ...` is added twice under Jupyter Book: a SyntaxError in
            # the browser console. An identical inline script twice is never useful: keep the first.
            key = tuple(sorted(attributes.items()))
            if key in inline_seen:
                continue
            inline_seen.add(key)
        scripts.append(js)
    context["script_files"] = scripts
    for key in ("body", "metatags"):
        if isinstance(context.get(key), str):
            context[key], _ = rewrite_cdn_urls(context[key], prefix)

    left = [os.fspath(getattr(js, "filename", js) or "") for js in scripts]
    left = [f for f in left if "://" in f or f.startswith("//")]
    left += [os.fspath(getattr(c, "filename", c)) for c in context.get("css_files", [])
             if "://" in os.fspath(getattr(c, "filename", c))]
    left += external_resources(context.get("body", "") or "")
    for url in sorted(set(left)):
        logger.warning(f"external resource left in the page: {url} (the book must render offline: serve it from "
                       "the book, e.g. pin it in package.json and add a rewrite in _ext/bertbook/offline.py)",
                       location=pagename, type="bertbook", subtype="external")


def check_written_pages(app: Sphinx, exception: Exception | None) -> None:
    """build-finished: scan every written HTML file (templates included) for external resources."""
    if exception is not None or app.builder.format != "html":
        return
    outdir = Path(app.outdir)
    for page in sorted(outdir.rglob("*.html")):
        if VENDOR in page.relative_to(outdir).parts:
            continue
        urls = sorted(set(external_resources(page.read_text(encoding="utf-8", errors="replace"))))
        for url in urls:
            logger.warning(f"{page.relative_to(outdir)} loads {url} from outside the book (offline rendering)",
                           type="bertbook", subtype="external")
    for name in ("requirejs/require.js", "d3/d3.min.js", "jquery/jquery.min.js", MATHJAX_ENTRY):
        if not (outdir / VENDOR / name).exists():
            logger.warning(f"{VENDOR}/{name} is missing from the built book", type="bertbook", subtype="external")
