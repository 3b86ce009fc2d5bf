"""The diagrams: figures/*.svg are exactly what figures/make_figures.py writes, every bertlib name they show exists,
they are self-contained SVG with a title and a description, and the book's figure cells point at them with alt
text (chapters 2-8: the architecture with their part highlighted, right after the title)."""

from __future__ import annotations

import importlib.util
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest

import bertlib

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
SVG = "{http://www.w3.org/2000/svg}"
_FIGURE = re.compile(r"```\{figure\}[ \t]+(\S+)\n((?::[\w-]+:[^\n]*\n)*)\n?(.*?)```", re.S)


def _make_figures():
    spec = importlib.util.spec_from_file_location("make_figures", FIGURES / "make_figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MF = _make_figures()
RENDERED = MF.render_all()


def _figures_in(text: str) -> list[tuple[str, dict[str, str], str]]:
    found = []
    for path, options, caption in _FIGURE.findall(text):
        opts = dict(re.findall(r":([\w-]+):[ \t]*([^\n]*)", options))
        found.append((path, opts, caption.strip()))
    return found


def test_committed_svgs_are_the_scripts_output():
    committed = {p.name for p in FIGURES.glob("*.svg")}
    assert committed == set(RENDERED), (f"figures/ holds {sorted(committed ^ set(RENDERED))} that the script does "
                                        "not write, or misses some: run `python figures/make_figures.py`")
    for name, text in RENDERED.items():
        assert (FIGURES / name).read_text(encoding="utf-8") == text, (
            f"figures/{name} differs from what figures/make_figures.py writes: run `python figures/make_figures.py`")


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_svg_is_self_contained_with_title_and_description(name):
    root = ET.fromstring(RENDERED[name])
    assert root.tag == SVG + "svg" and root.get("role") == "img"
    assert root.find(SVG + "title").text.strip() and len(root.find(SVG + "desc").text) > 80
    assert "currentColor" in RENDERED[name] and "background: transparent" in root.get("style")
    # nothing fetched: no external reference, no embedded image or font
    assert not re.search(r"(href|src)\s*=\s*[\"'](?!#)", RENDERED[name]), f"{name} references a file or URL"
    assert "@import" not in RENDERED[name] and "<image" not in RENDERED[name]


def test_every_bertlib_name_the_diagrams_show_exists():
    for dotted in MF.BERTLIB_NAMES:
        obj = bertlib
        for part in dotted.split("."):
            if not hasattr(obj, part):
                obj = importlib.import_module(f"{obj.__name__}.{part}")
            else:
                obj = getattr(obj, part)
        assert callable(obj), f"bertlib.{dotted} is shown in a diagram but is not a function or class"
    shown = "\n".join(RENDERED.values())
    for name in re.findall(r"bertlib\.([\w.]+)", shown):
        assert name.rstrip(".") in MF.BERTLIB_NAMES or name.split(".")[0] in MF.BERTLIB_NAMES, name


def test_each_chapter_highlights_its_own_part():
    plain = RENDERED["bert_architecture.svg"]
    assert 'class="here' not in plain
    for chapter, parts in MF.CHAPTER_PARTS.items():
        svg = RENDERED[f"bert_architecture_ch{chapter:02d}.svg"]
        assert svg.count('class="here') == len(parts), chapter
        assert f"chapter {chapter}</text>" in svg, f"chapter {chapter}: no 'you are here' note"


def test_intro_shows_the_architecture():
    figures = _figures_in((ROOT / "intro.md").read_text(encoding="utf-8"))
    assert [f[0] for f in figures] == ["figures/bert_architecture.svg"]
    _, opts, caption = figures[0]
    assert opts.get("alt") and "bert-diagram" in opts.get("class", "") and caption


@pytest.mark.parametrize("chapter", sorted(MF.CHAPTER_PARTS))
def test_chapter_opens_with_you_are_here(chapter):
    path = next((ROOT / "chapters").glob(f"{chapter:02d}_*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].source.startswith("# "), f"{path.name}: the first cell is the title"
    figures = _figures_in(nb.cells[1].source)
    assert nb.cells[1].cell_type == "markdown" and len(figures) == 1, f"{path.name}: cell 2 is the diagram"
    target, opts, caption = figures[0]
    assert target == f"../figures/bert_architecture_ch{chapter:02d}.svg"
    assert opts.get("alt") and "bert-diagram" in opts.get("class", "") and "You are here" in caption


def test_every_figure_cell_points_at_a_diagram_with_alt_text():
    used = set()
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type != "markdown":
                continue
            for target, opts, caption in _figures_in(cell.source):
                assert (path.parent / target).resolve().is_file(), f"{path.name}: {target} does not exist"
                assert opts.get("alt") and caption, f"{path.name}: {target} needs :alt: and a caption"
                used.add(Path(target).name)
    assert {"attention_head.svg", "head_split.svg", "pipeline_stages.svg", "mlm_nsp_input.svg"} <= used
    # every figure is shown somewhere, except those drawn for chapters that have not taken them up yet
    assert set(MF.OFFERED) <= set(RENDERED)
    assert used | {"bert_architecture.svg"} | set(MF.OFFERED) == set(RENDERED), (
        f"figures no page shows: {sorted(set(RENDERED) - used - {'bert_architecture.svg'} - set(MF.OFFERED))}")


def test_script_writes_the_files(tmp_path):
    assert MF.main(["--out", str(tmp_path)]) == 0
    assert {p.name: p.read_text(encoding="utf-8") for p in tmp_path.glob("*.svg")} == RENDERED


# ------------------------------------------------------------------------------------- everything on the canvas

#: Average advance of one character, as a fraction of the font size: DejaVu Sans Mono is 0.602; DejaVu Sans (the
#: first choice of the sans stack) averages about 0.54 on the diagrams' text, taken here as 0.55; bold is wider.
_ADVANCE = {"mono": 0.61, "sans": 0.55}
_BOLD = 1.08


def _text_styles(svg_text: str) -> dict[str, dict[str, object]]:
    """CSS class (or ``text``) -> {size, mono, bold}, read from the SVG's own ``<style>``."""
    css = re.search(r"<style>(.*?)</style>", svg_text, re.S).group(1)
    styles = {}
    for selector, body in re.findall(r"(text|\.[\w-]+)\s*\{([^}]*)\}", css):
        entry = {}
        if m := re.search(r"font-size:\s*([\d.]+)px", body):
            entry["size"] = float(m.group(1))
        if "font-family" in body:
            entry["mono"] = "Mono" in body or "monospace" in body
        if "font-weight: bold" in body:
            entry["bold"] = True
        styles[selector.lstrip(".")] = entry
    return styles


def _text_box(el, styles) -> tuple[float, float, float, float]:
    """(left, top, right, bottom) of a <text> element, its width estimated from font size x characters."""
    font = {"size": 13.0, "mono": False, "bold": False} | styles["text"]
    for name, entry in styles.items():           # later rules win, as in CSS: the stylesheet's order
        if name in (el.get("class") or "").split():
            font |= entry
    size = font["size"]
    width = len(el.text or "") * size * _ADVANCE["mono" if font["mono"] else "sans"] * (_BOLD if font.get("bold")
                                                                                        else 1.0)
    x, y = float(el.get("x")), float(el.get("y"))
    start = {"start": 0.0, "middle": 0.5, "end": 1.0}[el.get("text-anchor", "start")] * width
    if "rotate(-90" in (el.get("transform") or ""):   # reads upwards from (x, y)
        return x - 0.8 * size, y - width + start, x + 0.25 * size, y + start
    return x - start, y - 0.8 * size, x - start + width, y + 0.25 * size


def _rects(root) -> list[tuple[float, float, float, float]]:
    return [(float(r.get("x")), float(r.get("y")), float(r.get("x")) + float(r.get("width")),
             float(r.get("y")) + float(r.get("height"))) for r in root.iter(SVG + "rect")]


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_every_rect_and_text_lies_inside_the_viewbox(name):
    root = ET.fromstring(RENDERED[name])
    x0, y0, width, height = (float(v) for v in root.get("viewBox").split())
    styles = _text_styles(RENDERED[name])
    out = []
    for left, top, right, bottom in _rects(root):
        if left < x0 or top < y0 or right > x0 + width or bottom > y0 + height:
            out.append(f"rect ({left:g}, {top:g})-({right:g}, {bottom:g})")
    for el in root.iter(SVG + "text"):
        left, top, right, bottom = _text_box(el, styles)
        if left < x0 or top < y0 or right > x0 + width or bottom > y0 + height:
            out.append(f"text {el.text!r} ({left:.0f}, {top:.0f})-({right:.0f}, {bottom:.0f})")
    assert not out, f"{name}: outside the viewBox 0 0 {width:g} {height:g}: " + "; ".join(out)


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_text_inside_a_box_fits_the_box(name):
    """A label whose anchor lies in a box stays within the innermost box that holds it (with 1 px of slack)."""
    root = ET.fromstring(RENDERED[name])
    styles = _text_styles(RENDERED[name])
    rects = _rects(root)
    out = []
    for el in root.iter(SVG + "text"):
        if not (el.text or "").strip() or el.get("transform"):
            continue
        x, y = float(el.get("x")), float(el.get("y"))
        holders = [r for r in rects if r[0] < x < r[2] and r[1] < y - 4 < r[3]]
        if not holders:
            continue
        left, top, right, bottom = min(holders, key=lambda r: (r[2] - r[0]) * (r[3] - r[1]))
        tl, _, tr, _ = _text_box(el, styles)
        if tl < left - 1 or tr > right + 1:
            out.append(f"{el.text!r} spans x {tl:.0f}-{tr:.0f}, its box x {left:g}-{right:g}")
    assert not out, f"{name}: " + "; ".join(out)
