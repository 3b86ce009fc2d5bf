"""Measures of a chapter's readability: mean sentence length of its prose, the words of prose in its main flow
and the length of its code cells.

``python tests/prose.py [chapters/NN_name.ipynb ...]`` prints a table (every chapter in _toc.yml by default);
``tests/test_course.py`` asserts the limits below on every chapter (the word limit on the core chapters).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat

#: Upper bounds the course keeps (issue 25): a learner reads short sentences and short cells.
MAX_MEAN_SENTENCE_WORDS = 24.0
MAX_VISIBLE_CELL_LINES = 40
MAX_HIDDEN_CELL_LINES = 60
#: A core chapter is a lesson (issue 35): at most this many words of prose in its main flow, that is outside
#: collapsed boxes (``:class: dropdown``), code and math. The proof beside the lesson sits in those boxes.
MAX_FLOW_WORDS = 3000

_FENCE = re.compile(r"^(```|~~~|:::).*?^\1\s*$", re.S | re.M)
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$", re.S)
_CODE = re.compile(r"`[^`\n]*`")
_ROLE = re.compile(r"\{[\w:-]+\}")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_TABLE_OR_HEADING = re.compile(r"^\s*(\|.*|#{1,6} .*|\*Figure [^\n]*)$", re.M)
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[A-Z0-9(\"'*_`$])")
_ABBREV = re.compile(r"\b(e\.g|i\.e|et al|cf|vs|Fig|Eq|App|Sec|approx|etc)\.", re.I)


def prose(markdown: str, math: str = "x", code: str = "code") -> str:
    """The running text of a markdown cell: no fenced code, tables, headings, captions or directive lines (fences
    and option lines such as ``:class:`` or ``:alt:``). Math becomes ``math`` and inline code ``code``: one word
    each, so a sentence keeps its length; pass ``" "`` to drop them (:func:`words`).

    Dropdown boxes (solutions, "Going further") keep their prose: only their fence lines go.
    """
    text = re.sub(r"^(```|:::)\{?[\w -]*\}?.*$|^(```|:::)\s*$|^:\w[\w-]*:.*$", "", markdown, flags=re.M)
    text = re.sub(r"^```[\s\S]*?^```", "", text, flags=re.M)
    text = _TABLE_OR_HEADING.sub("", text)
    text = _MATH.sub(math, text)
    text = _CODE.sub(code, text)
    text = _LINK.sub(r"\1", _ROLE.sub("", text))
    return _ABBREV.sub(lambda m: m.group(1).replace(".", ""), text)


def sentences(markdown: str) -> list[str]:
    """The sentences of a markdown cell's prose; list items and paragraphs end a sentence too."""
    out = []
    for block in re.split(r"\n\s*\n|\n\s*[-*+] |\n\s*\d+\. ", prose(markdown)):
        block = " ".join(block.split())
        out += [s for s in _SENTENCE_END.split(block) if len(s.split()) >= 3]
    return out


def mean_sentence_words(nb) -> tuple[float, int]:
    """(mean words per sentence, number of sentences) over a notebook's markdown cells."""
    lengths = [len(s.split()) for c in nb.cells if c.cell_type == "markdown" for s in sentences(c.source)]
    return (sum(lengths) / len(lengths) if lengths else 0.0), len(lengths)


_OPEN_FENCE = re.compile(r"^\s*(:{3,}|`{3,})\{([\w-]+)\}")


def main_flow(markdown: str) -> str:
    """A markdown cell without its collapsed boxes: every ``:::{...}`` or ```` ```{...} ```` directive whose options
    say ``:class: dropdown`` (or a ``{dropdown}`` directive) is dropped with its body, nested fences included."""
    lines, out, i = markdown.split("\n"), [], 0
    while i < len(lines):
        m = _OPEN_FENCE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        fence, j = m.group(1), i + 1
        collapsed = m.group(2) == "dropdown"
        while j < len(lines) and re.match(r"^\s*:\w[\w-]*:", lines[j]):
            collapsed |= bool(re.match(r"^\s*:class:.*\bdropdown\b", lines[j]))
            j += 1
        end = j
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if not collapsed:
            out.append(lines[i])
            out += main_flow("\n".join(lines[j:end])).split("\n")   # an open box may hold a collapsed one
            out.append(fence)
        i = end + 1
    return "\n".join(out)


def words(markdown: str) -> int:
    """Words of running text (:func:`prose`, with math and inline code dropped)."""
    return len(re.findall(r"[A-Za-z0-9][\w'’.-]*", prose(markdown, math=" ", code=" ")))


def flow_words(nb) -> int:
    """Words of prose in a notebook's main flow: its markdown cells less collapsed boxes, code and math."""
    return sum(words(main_flow(c.source)) for c in nb.cells if c.cell_type == "markdown")


def hidden(cell) -> bool:
    return "hide-input" in cell.metadata.get("tags", []) or "solution" in cell.metadata.get("tags", [])


def long_cells(nb) -> list[tuple[int, int, int]]:
    """``(cell index, lines, limit)`` of every code cell longer than its limit (visible 40, hidden 60)."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        limit = MAX_HIDDEN_CELL_LINES if hidden(cell) else MAX_VISIBLE_CELL_LINES
        n = len(cell.source.rstrip("\n").splitlines())
        if n > limit:
            out.append((i, n, limit))
    return out


def main(paths: list[str]) -> None:
    if not paths:
        sys.path.insert(0, str(Path(__file__).parent))
        from toc import notebooks

        paths = [str(p) for p in notebooks() if p.parent.name == "chapters"]
    print(f"{'chapter':32} {'sentences':>9} {'mean words':>10}  {'flow words':>10}  long cells (index: lines > limit)")
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        mean, n = mean_sentence_words(nb)
        flag = " !" if mean > MAX_MEAN_SENTENCE_WORDS else "  "
        flow = flow_words(nb)
        flow_flag = " !" if flow > MAX_FLOW_WORDS else "  "
        cells = ", ".join(f"{i}: {n_} > {lim}" for i, n_, lim in long_cells(nb))
        print(f"{Path(path).stem:32} {n:9d} {mean:10.1f}{flag} {flow:10d}{flow_flag} {cells}")


if __name__ == "__main__":
    main(sys.argv[1:])
