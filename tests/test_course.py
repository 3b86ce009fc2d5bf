"""The course as a learner reads it: one notation (``notation.md`` is the law), short cells, short sentences, no
talk of the project's own goals, and every glossary link and table entry in place.

Read from the notebooks' text and syntax trees only (nothing is executed), so the whole file runs in seconds:
``python -m pytest tests/test_course.py -q``. ``python tests/prose.py`` prints the readability table alone.
"""

from __future__ import annotations

import ast
import importlib
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import nbformat
import pytest
import yaml

import prose
from toc import ROOT, core_notebooks, notebooks, toc_files

CHAPTERS = [p for p in notebooks() if p.parent.name == "chapters"]
PAGES = [ROOT / "intro.md", ROOT / "glossary.md", ROOT / "notation.md"]
_ids = {"ids": lambda p: p.stem}


def _nb(path: Path):
    return nbformat.read(path, as_version=4)


def _markdown(path: Path) -> str:
    """A chapter's markdown cells (captions and alt text included), or a page's text."""
    if path.suffix == ".md":
        return path.read_text(encoding="utf-8")
    return "\n\n".join(c.source for c in _nb(path).cells if c.cell_type == "markdown")


def _code(path: Path) -> list[str]:
    return [c.source for c in _nb(path).cells if c.cell_type == "code"]


def _hits(patterns: list[str], text: str, flags: int = 0) -> list[str]:
    """Every match of the patterns in the text, each with a little context."""
    spans = sorted({(m.start(), m.end()) for pattern in patterns for m in re.finditer(pattern, text, flags)})
    out, last = [], -1
    for start, end in spans:
        if start < last:                  # one place, matched by two patterns
            continue
        a, b = max(start - 40, 0), min(end + 40, len(text))
        out.append("…" + " ".join(text[a:b].split()) + "…")
        last = end
    return out


# ----------------------------------------------------------------------------------------- the notation's letters

def _notation() -> tuple[set[str], set[str], dict[str, str]]:
    """(size letters, tensor letters, letter -> config field) as ``notation.md`` defines them."""
    text = (ROOT / "notation.md").read_text(encoding="utf-8")
    sizes, fields = set(), {}
    for letter, code in re.findall(r"^\| \$([A-Z])\$ \|[^|]*\| `?([\w.]*)", text, re.M):
        sizes.add(letter)
        if code and "_" in code:
            fields[letter] = code
    tensors = set()
    for heading in re.findall(r"^([A-Z](?:, [A-Za-z])*) \(", text, re.M):
        tensors |= {s for s in heading.split(", ") if len(s) == 1 and s.isupper()}
    return sizes, tensors - sizes, fields


SIZE_LETTERS, TENSOR_LETTERS, FIELD_OF = _notation()
LETTER_OF_FIELD = {field: letter for letter, field in FIELD_OF.items()}
LETTERS = SIZE_LETTERS | TENSOR_LETTERS


def test_notation_defines_the_letters_the_checks_rely_on():
    assert {"B", "T", "H", "A", "L", "I", "N", "P", "C", "S"} <= SIZE_LETTERS, SIZE_LETTERS
    assert {"Q", "K", "V", "M", "W"} <= TENSOR_LETTERS, TENSOR_LETTERS
    assert FIELD_OF["L"] == "num_hidden_layers" and FIELD_OF["C"] == "num_labels" and FIELD_OF["H"] == "hidden_size"


# ------------------------------------------------------------------------------------------ notation in the prose

#: $N$ (or N) used for the number of layers; notation.md keeps N for appendix 14's parameter count.
LAYERS_AS_N = [
    r"\$N\$[- ](encoder |transformer |hidden )?layers?\b", r"\bN (encoder |transformer )?layers\b",
    r"(one|each|all|any) of (the )?\$?N\$?\b(?! ?[=-])", r"(×|\\times)\s*\$?N\$?(?![\w(])",
    r"\$?N\$?\s*=\s*`?(config\.)?num_hidden_layers", r"layers?[, (]+\$N\$", r"\$N\s*=\s*\d+\$?\s*layers",
]
#: K used for the number of classes, and "log K" for the compact vocabulary (it is log |V_c|).
CLASSES_AS_K = [
    r"\$K\$[- ]classe?s?\b", r"\bK classes\b", r"\$?K\$?\s*=\s*`?(config\.)?num_labels", r"classes,? \$K\$",
    r"\\frac\s*\{?1\}?\s*\{?K\}", r"\\log\s*K\b", r"\blog K\b", r"\blog\(K\)", r"\$K\$-way",
]


@pytest.mark.parametrize("path", CHAPTERS + PAGES, **_ids)
def test_layers_are_L_and_classes_are_C(path):
    text = _markdown(path)
    found = [f"layers as N: {h}" for h in _hits(LAYERS_AS_N, text)]
    found += [f"K for classes or the compact vocabulary: {h}" for h in _hits(CLASSES_AS_K, text)]
    if path.suffix == ".ipynb":   # what the code prints ("log K = ...") is prose too
        found += [f"code prints K: {h}" for h in _hits([r"\blog K\b", r"\blog\(K\)", r"\bK classes\b"],
                                                        "\n".join(_code(path)))]
    assert not found, f"{path.name} (notation.md: layers L, classes C, compact vocabulary |V_c|):\n" + "\n".join(found)


#: notation.md: Q = h W_Q^T + b_Q from the layer input h (x is the embedding sum before LayerNorm); a head is
#: numbered a (h is a hidden state); positions are i (query) and j (key).
OTHER_NOTATION = {
    "Q, K or V computed from x (the layer input is h)": [r"[QKV](_\{?[\w,]+\}?)?\s*=\s*[xX]\s*W", r"\bX\s*W_\{?[QKV]"],
    "head index h (heads are numbered a)": [r"\b[Hh]eads? \$h\$", r"\$h\s*\\?,?\s*d\b", r"_\{[QKVO],\s*h\}",
                                            r"\$[QKV]_h\$", r"\(h\s*\+\s*1\)\s*\\?,?\s*d"],
    "positions l, r (positions are i and j)": [r"\$[^$\n]*\bl\s*-\s*r\b[^$\n]*\$", r"\(l\s*\+\s*1,\s*r\s*\+\s*1\)"],
    "d for the width (d is the head size; the width is H)": [r"d_\{?\\text\{model\}\}?(?![^.]*papers)"],
}


@pytest.mark.parametrize("path", CHAPTERS, **_ids)
def test_one_notation(path):
    text = _markdown(path)
    found = [f"{what}: {h}" for what, patterns in OTHER_NOTATION.items() for h in _hits(patterns, text)]
    assert not found, f"{path.name} (see notation.md):\n" + "\n".join(found)


def _svg_texts(svg: str) -> list[str]:
    root = ET.fromstring(svg)
    return [el.text or "" for el in root.iter() if el.tag.split("}")[-1] in ("text", "title", "desc")]


@pytest.mark.parametrize("path", sorted((ROOT / "figures").glob("*.svg")), **_ids)
def test_figures_use_the_notation(path):
    texts = _svg_texts(path.read_text(encoding="utf-8"))
    joined = "\n".join(texts)
    found = [f"N: {t!r}" for t in texts if re.search(r"(?<![\w.\-/])N(?![\w.\-/])", t)]
    found += [f"K classes: {h}" for h in _hits(CLASSES_AS_K, joined)]
    if re.search(r"\bhead [1-9]", joined):
        assert "head 0" in joined, f"{path.name}: heads are numbered from 0 (it shows head 1 but no head 0)"
    if re.search(r"\bt1\b", joined):
        assert re.search(r"\bt0\b", joined), f"{path.name}: tokens are numbered from 0"
    assert not found, f"{path.name} (layers are L, classes C):\n" + "\n".join(found)


# --------------------------------------------------------------------------------- code does not shadow the letters

def _parse(source: str) -> ast.Module | None:
    lines = [ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value)):
        return f"{base}.{node.attr}"
    return None


def _is_module(dotted: str | None, modules: dict[str, str]) -> bool:
    """Whether a name (``bertlib.training.pretraining``, or a name bound by ``import``) is a module."""
    if not dotted:
        return False
    root, _, rest = dotted.partition(".")
    if root not in modules:
        return False
    path = modules[root] + (f".{rest}" if rest else "")
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def _config_field(node: ast.AST) -> str | None:
    """``config.hidden_size``, ``pt.config.hidden_size``, ``config["hidden_size"]``: the field's name."""
    if isinstance(node, ast.Attribute) and (_dotted(node.value) or "").split(".")[-1] == "config":
        return node.attr
    if (isinstance(node, ast.Subscript) and (_dotted(node.value) or "").split(".")[-1] == "config"
            and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str)):
        return node.slice.value
    return None


_SIZE_CALLS = {"len", "int", "sum", "max", "min", "round", "ceil", "floor", "size", "numel", "item", "count",
               "prod", "divmod", "get", "getattr"}


def _size_like(node: ast.AST) -> bool:
    """Whether an expression reads as a count or size (what a size letter may hold)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return True                       # config fields (checked separately), .shape, a counter's attribute
    if isinstance(node, ast.Subscript):
        return True                       # x.shape[0], lengths[i]
    if isinstance(node, ast.Call):
        name = (_dotted(node.func) or "").split(".")[-1]
        return name in _SIZE_CALLS or any(w in name for w in ("param", "count", "size", "len", "num", "step"))
    if isinstance(node, ast.BinOp):
        return _size_like(node.left) and _size_like(node.right)
    if isinstance(node, ast.UnaryOp):
        return _size_like(node.operand)
    if isinstance(node, ast.IfExp):
        return _size_like(node.body) and _size_like(node.orelse)
    return False


def _counts(node: ast.AST) -> bool:
    """Whether an expression is plainly a count (what a tensor letter must not hold)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int) and not isinstance(node.value, bool)
    if _config_field(node):
        return True
    if isinstance(node, ast.Call):
        return (_dotted(node.func) or "").split(".")[-1] in {"len", "int", "numel", "count"}
    return False


def _pairs(target: ast.AST, value: ast.AST):
    """(name, expression) for each plain name a single assignment binds; expression None when unpacked."""
    if isinstance(target, ast.Name):
        yield target.id, value
    elif isinstance(target, (ast.Tuple, ast.List)):
        if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
            for t, v in zip(target.elts, value.elts, strict=True):
                yield from _pairs(t, v)
        elif isinstance(value, ast.IfExp):
            for branch in (value.body, value.orelse):
                yield from _pairs(target, branch)
        else:
            for t in target.elts:
                yield from _pairs(t, None)


def alias_problems(source: str) -> list[str]:
    """Where a cell's code gives a notation letter another meaning (see notation.md, "Names in code")."""
    tree = _parse(source)
    if tree is None:
        return []
    modules: dict[str, str] = {}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                modules[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                modules[a.asname or a.name] = f"{node.module}.{a.name}"
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for a in node.names:
                bound = a.asname or a.name.split(".")[0]
                full = a.name if isinstance(node, ast.Import) else f"{node.module}.{a.name}"
                if len(bound) == 1 and bound.isupper() and not (bound == "F" and full == "torch.nn.functional"):
                    out.append(f"`{ast.unparse(node)}`: a module keeps its name (one capital letter reads as "
                               "notation; only `import torch.nn.functional as F` is usual)")
            continue
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        for target in targets:
            for name, expr in _pairs(target, value):
                line = ast.unparse(node)[:90]
                if name == "F":
                    out.append(f"`{line}`: F is PyTorch's `torch.nn.functional` in this book")
                if name not in LETTERS:
                    continue
                if isinstance(node.value, ast.Call) and (_dotted(node.value.func) or "").endswith("setup"):
                    out.append(f"`{line}`: write `session = bertlib.course.setup()`")
                    continue
                if expr is None:
                    continue
                if _is_module(_dotted(expr), modules):
                    out.append(f"`{line}`: {name} is a module alias here; notation.md's {name} is a size or tensor")
                elif (field := _config_field(expr)) and field in LETTER_OF_FIELD and LETTER_OF_FIELD[field] != name:
                    out.append(f"`{line}`: `{field}` is {LETTER_OF_FIELD[field]} in notation.md, not {name}")
                elif name in FIELD_OF and (field := _config_field(expr)) and field != FIELD_OF[name]:
                    out.append(f"`{line}`: {name} is `{FIELD_OF[name]}` in notation.md")
                elif name in SIZE_LETTERS and not _size_like(expr):
                    out.append(f"`{line}`: {name} is a size in notation.md; name this value for what it is")
                elif name in TENSOR_LETTERS and _counts(expr):
                    out.append(f"`{line}`: {name} is a tensor in notation.md (a count is a size letter, e.g. |V|)")
    return list(dict.fromkeys(out))


def test_alias_checker_catches_the_known_cases():
    bad = ["S = bertlib.course.setup()", "from bertlib.training import pretraining as P",
           "from bertlib.tasks import heads as H",
           "import bertlib.training.pretraining\nP = bertlib.training.pretraining",
           "C = cosine_matrix(table)", "V = len(tokenizer)", "H = config.num_attention_heads", "F = {'train': 1}",
           "from bertlib.variants import relative_position as R",
           "L, A = config.num_attention_heads, config.num_hidden_layers"]
    good = ["session = bertlib.course.setup()", "import torch.nn.functional as F", "L = config.num_hidden_layers",
            "H, P = config.hidden_size, config.max_position_embeddings", "B, T = input_ids.shape",
            "B, T = (16, 128) if QUICK else (32, 512)", "N = bench.matmul_params(sd)", "T = enc['input_ids'].shape[1]",
            "Q = hidden @ W_q.T + b_q", "W = torch.tensor(coef)", "from bertlib.training import pretraining"]
    for src in bad:
        assert alias_problems(src), src
    for src in good:
        assert not alias_problems(src), (src, alias_problems(src))


@pytest.mark.parametrize("path", CHAPTERS, **_ids)
def test_code_does_not_shadow_notation_letters(path):
    found = [p for source in _code(path) for p in alias_problems(source)]
    assert not found, f"{path.name} (notation.md, 'Names in code'):\n" + "\n".join(found)


# ------------------------------------------------------------------------------------------------- readability

def readability_table() -> str:
    """Every chapter's sentences, mean words per sentence and over-long code cells (as ``tests/prose.py``)."""
    rows = [f"{'chapter':32} {'sentences':>9} {'mean words':>10}  long cells (index: lines > limit)"]
    for path in CHAPTERS:
        nb = _nb(path)
        mean, n = prose.mean_sentence_words(nb)
        flag = " !" if mean > prose.MAX_MEAN_SENTENCE_WORDS else "  "
        cells = ", ".join(f"{i}: {n_} > {lim}" for i, n_, lim in prose.long_cells(nb))
        rows.append(f"{path.stem:32} {n:9d} {mean:10.1f}{flag} {cells}")
    return "\n".join(rows)


def test_print_the_readability_table():
    print("\n" + readability_table())


@pytest.mark.parametrize("path", CHAPTERS, **_ids)
def test_code_cells_are_short(path):
    long = prose.long_cells(_nb(path))
    assert not long, (f"{path.name}: code cells over their limit (visible {prose.MAX_VISIBLE_CELL_LINES} lines, "
                      f"hidden {prose.MAX_HIDDEN_CELL_LINES}): " + ", ".join(f"cell {i}: {n} lines > {lim}"
                                                                             for i, n, lim in long))


@pytest.mark.parametrize("path", CHAPTERS, **_ids)
def test_sentences_are_short(path):
    mean, n = prose.mean_sentence_words(_nb(path))
    assert mean <= prose.MAX_MEAN_SENTENCE_WORDS, (
        f"{path.name}: mean sentence length {mean:.1f} words over {n} sentences "
        f"(limit {prose.MAX_MEAN_SENTENCE_WORDS:g}; python tests/prose.py {path.relative_to(ROOT)})\n"
        + readability_table())


# ---------------------------------------------------------------------------------- the book talks about BERT

#: The project's own bookkeeping in the prose: goals, targets reached or missed, issue numbers, what the course
#: "aimed for". (Targets as labels, "the MLM targets", are fine; so is another project's issue, e.g.
#: "`transformers` issue #14859".)
BOOKKEEPING = [
    r"\btargets?\b[^.\n]{0,60}\b(reach|reached|met|meet|missed|miss|not reached|hold|holds|held)\b",
    r"\b(reach|reached|met|meet|missed|miss|beat|beats|below|above)\s+(the\s+|its\s+|our\s+|a\s+)?"
    r"(accuracy\s+|score\s+)?target\b",
    r"\btarget (accuracy|score)\b", r"\btarget\s*(of\s*)?\(?\s*0?\.\d{2,3}\b", r"\b0?\.\d{2,3}\s*\)?\s*target\b",
    r"\baim(ed|s|ing)?\s+(for|at)\b", r"\bthe course (aimed|wanted|promised)\b",
    r"(?<!transformers` )(?<!transformers )(?<!GitHub )(?<!PyTorch )(?<!torch )\bissues?\s+#?\d+\b",
    r"\b(this|that|our|the course's|the project's) issues?\b", r"\bissue (asks|requires|says|wants)\b",
]


@pytest.mark.parametrize("path", CHAPTERS + [ROOT / "intro.md"], **_ids)
def test_no_prose_about_targets_or_issues(path):
    found = _hits(BOOKKEEPING, _markdown(path), re.I)
    assert not found, (f"{path.name}: the prose speaks of the project's goals (targets, issues, what the course "
                       "aimed for); say what was measured instead:\n" + "\n".join(found))


@pytest.mark.parametrize("path", CHAPTERS, **_ids)
def test_glued_numbers_render_as_text(path):
    """``{glue:}`` pastes a glued string with its quotes ('0.93'); ``{glue:text}`` (or ``{glue:md}``) does not."""
    bare = re.findall(r"\{glue:?\}`[^`]*`", _markdown(path))
    assert not bare, f"{path.name}: use {{glue:text}}`name` (or {{glue:md}}) instead of {bare[:3]}"


# ------------------------------------------------------------------------------------ glossary, table, contents

def _glossary_terms(text: str) -> list[str]:
    terms = []
    for block in re.findall(r"```\{glossary\}\n(.*?)```", text, re.S):
        terms += [ln.strip() for ln in block.splitlines() if ln.strip() and not ln.startswith((" ", ":"))]
    return terms


def test_glossary_terms_are_unique():
    terms = [t for page in ("glossary.md", "notation.md")
             for t in _glossary_terms((ROOT / page).read_text(encoding="utf-8"))]
    dupes = sorted({t for t in terms if terms.count(t) > 1})
    assert not dupes, f"defined twice (a build error under -W): {dupes}"


#: The terms chapters link (helper rules, issue 25): each must have an entry.
LINKED_TERMS = ["AdamW", "warm-up", "weight decay", "gradient clipping", "TF-IDF", "LinearSVC", "temperature scaling",
                "macro-F1", "linear probe", "stratified split", "head+tail truncation", "causal mask",
                "cross-attention", "bfloat16", "float16", "autocast", "fused kernel", "tied weights",
                "unigram baseline", "permutation equivariance", "anisotropy", "WordPiece", "dropout", "pooler",
                "GELU", "residual stream", "cross-entropy", "distillation"]


def test_every_term_link_has_an_entry():
    defined = {t for page in ("glossary.md", "notation.md")
               for t in _glossary_terms((ROOT / page).read_text(encoding="utf-8"))}
    lower = {t.lower() for t in defined}
    assert set(LINKED_TERMS) <= defined, sorted(set(LINKED_TERMS) - defined)
    missing = []
    for path in CHAPTERS + [ROOT / p for p in ("intro.md", "glossary.md", "notation.md")]:
        for link in re.findall(r"\{term\}`([^`]*)`", _markdown(path)):
            target = m.group(1) if (m := re.search(r"<([^>]+)>\s*$", link)) else link
            if target.strip().lower() not in lower:
                missing.append(f"{path.name}: {{term}}`{link}`")
    assert not missing, "glossary links with no entry (a build error under -W -n):\n" + "\n".join(missing)


def _number(path: Path) -> str:
    """A chapter's number as its title gives it: '# 9b. Long documents' -> '9b'."""
    m = re.match(r"#\s+(\d+[a-z]?)\.", _nb(path).cells[0].source)
    assert m, f"{path.name}: the title starts with the chapter's number ('# 4. Attention, one head')"
    return m.group(1)


def test_intro_lists_every_chapter_in_toc_order():
    rows = re.findall(r"^\| (\d+[a-z]?)\. ", (ROOT / "intro.md").read_text(encoding="utf-8"), re.M)
    assert rows == [_number(p) for p in CHAPTERS], (rows, [_number(p) for p in CHAPTERS])


def test_the_core_path_is_marked():
    """The parts captioned "Core path: ..." hold the core path in reading order; every other part that holds chapters
    is captioned "Optional: ..." (the reference pages excepted). The orientation page opens it, the toy BERT comes
    before the tokenizer's plumbing, and pre-training's objectives before fine-tuning."""
    parts = yaml.safe_load((ROOT / "_toc.yml").read_text())["parts"]
    for part in parts:
        caption = str(part.get("caption", ""))
        if caption != "Reference":
            assert caption.startswith(("Core path: ", "Optional: ")), caption
    core = [p.stem for p in core_notebooks()]
    assert core[:3] == ["00_what_bert_is_for", "01b_bert_by_hand", "01_tokenization"], core
    assert core.index("11_pretraining") < core.index("09_20newsgroups"), core
    optional = {"09b_long_documents", "11b_pretraining_from_scratch", "12_numpy_bert", "13_hf_attention",
                "14_making_it_fast", "15b_span_and_tag_tasks"}
    assert not optional & set(core), optional & set(core)


def test_the_appendix_comes_last():
    chapters = [f for f in toc_files() if f.startswith("chapters/") and f != "chapters/bibliography"]
    assert chapters[-1] == "chapters/14_making_it_fast", chapters
    assert chapters.index("chapters/15_bert_family") < chapters.index("chapters/14_making_it_fast")
    if (ROOT / "chapters/09b_long_documents.ipynb").exists():
        assert chapters.index("chapters/09b_long_documents") == chapters.index("chapters/09_20newsgroups") + 1


# ----------------------------------------------------------------------------------- core chapters are lessons

def _core_chapters() -> list[Path]:
    """The core path: ``toc.core_notebooks()`` (parts whose caption starts with "Core path") once _toc.yml marks
    them, else chapters 1b and 1 to 8."""
    import toc
    if hasattr(toc, "core_notebooks") and (core := [p for p in toc.core_notebooks() if p.parent.name == "chapters"]):
        return core
    return [p for p in CHAPTERS if re.match(r"0(1b?|[2-8])_", p.name)]


CORE = _core_chapters()


def test_flow_words_skip_boxes_code_and_math():
    md = ("Two words.\n\n:::{admonition} How we know: a long proof\n:class: dropdown\nmany many many words\n:::\n\n"
          "```{admonition} Solution\n:class: dropdown\nhidden words here\n```\n\n"
          ":::{note}\nan open note counts\n:::\n\n$$x^2 + y$$ and $a = b$ and `code here` end.")
    assert prose.main_flow(md).count("many") == 0 and "open note" in prose.main_flow(md)
    assert prose.words(prose.main_flow(md)) == len("Two words. an open note counts and and end.".split())


@pytest.mark.parametrize("path", CORE, **_ids)
def test_core_chapters_are_lessons(path):
    n = prose.flow_words(_nb(path))
    assert n <= prose.MAX_FLOW_WORDS, (
        f"{path.name}: {n} words of prose in the main flow (limit {prose.MAX_FLOW_WORDS}). Move the proof (tolerances, "
        "margins, checkpoint cases, timings, library history) into collapsed 'How we know' boxes "
        f"(:class: dropdown); python tests/prose.py {path.relative_to(ROOT)}")


# ---------------------------------------------------------------------------------- one meaning per symbol

#: Uses of a letter that notation.md gives another meaning, as (the letter notation.md must define, what the
#: use means, patterns). The patterns read the markdown (math included) and, for figure labels, the code.
FORBIDDEN_USES = [
    ("σ", "σ as the sigmoid (σ is a standard deviation; write sigmoid)",
     [r"\\sigma\s*\(", r"σ\(", r"\\sigma\\!?\s*\\left\("]),
    ("σ", "σ as √(σ² + ε) (σ is the standard deviation alone; write the square root)",
     [r"\\sigma\s*=\s*\\sqrt\{[^$]*\\epsilon", r"/\s*\\sigma\b(?!\^)"]),
    ("w", "w as a word (w numbers chapter 9b's windows)", [r"\bword \$w\$", r"\$w\$'s own", r"\bwords? \$w_"]),
    ("ℓ", "a depth axis that counts ℓ + 1 or ℓ − 1 (plot over ℓ of h^(ℓ), 0 = the embeddings)",
     [r"ℓ\s*[−-]\s*1\s*\)", r"=\s*(output of|after) layer ℓ\s*[+−-]\s*1", r"after layer ℓ\s*\+\s*1"]),
    ("W", "a weight before the vector, the column-vector convention (the book writes h W^T + b)",
     [r"\bW_?\{?\w*\}?\s*\\?,?\s*[hxe]\s*\+\s*b", r"\bW_\{?[12QKVOPC]\}?\s*\\,?\s*\\mathrm\{GELU\}",
      r"\bW_\{?[12QKVOPC]\}?\s*\\?,?\s*[hxep]_\{?[\w+−-]+\}?"]),
    ("I", "I as the identity matrix (I is the feed-forward width; write \\mathrm{Id})",
     [r"(?<![\w\\{])I\s*[+−-]\s*\\(?:partial|frac|mathbf)", r"\\left\(\s*I\b", r"\(\s*I\s*[+−-]\s*\\partial"]),
    ("T", "attention cost as O(n²·d) (T is the sequence length; d is the head size: O(T²H) per layer)",
     [r"O\(\s*n\^?\{?2\}?\s*(\\cdot|·)\s*d\s*\)", r"O\(n²·d\)"]),
]


def forbidden_uses(text: str) -> list[str]:
    return [f"{what}: {h}" for _, what, patterns in FORBIDDEN_USES for h in _hits(patterns, text)]


def test_notation_defines_the_symbols_it_forbids_to_reuse():
    text = (ROOT / "notation.md").read_text(encoding="utf-8")
    for letter in {letter for letter, _, _ in FORBIDDEN_USES} | {"θ", "ḡ", "PE"}:
        latex = {"θ": r"\theta", "ḡ": r"g$, $\bar g", "σ": r"\sigma"}.get(letter, letter)
        entry = rf"^(?:\S+, )*{re.escape(letter)}[ ,(]|^\| \${re.escape(latex)}\$"   # a glossary entry or a table row
        assert re.search(entry, text, re.M), f"notation.md has no entry for {letter}"
    assert not forbidden_uses(text), forbidden_uses(text)


def test_forbidden_uses_catch_the_old_text():
    old = [r"$\mathrm{softmax}(z_0, z_1)_0 = \sigma(z_0 - z_1)$",
           r"with mean $\mu$, $\sigma = \sqrt{\mathrm{var}(r) + \epsilon}$ and $\hat r = (r - \mu)/\sigma$",
           r"the score of word $w$ at position $t$",
           'ax.set_xlabel("hidden_states index (emb = embeddings, ℓ = after layer ℓ − 1)")',
           r"$h \leftarrow h + W_2\,\mathrm{GELU}(W_1 h + b_1) + b_2$", r"costs $O(n^2 \cdot d)$",
           r"$W_K p_{i-1} \approx c\, W_Q p_i$", r"$\partial (h + f(h)) / \partial h = I + \partial f / \partial h$",
           r"$J_{\mathrm{LN}}\,(I + \partial f / \partial h)$", r"\left(I - \frac{\mathbf{1}\mathbf{1}^\top}{H}"]
    for text in old:
        assert forbidden_uses(text), text
    new = [r"$\mathrm{softmax}(z_0, z_1)_0 = \mathrm{sigmoid}(z_0 - z_1)$",
           r"$\hat r = (r - \mu)/\sqrt{\sigma^2 + \epsilon}$", r"$\sigma^2 = \frac{1}{H}\sum_c (x_c - \mu)^2$",
           r"$h \leftarrow h + \mathrm{GELU}(h W_1^\top + b_1) W_2^\top + b_2$", r"window $w$ gets the score $s_w$",
           'ax.set_xlabel("ℓ: hidden state $h^{(ℓ)}$ (0 = the embeddings)")', r"$O(T^2 H)$ per layer",
           r"$k_{i-1} = W_{\text{pos}}[i-1]\,W_K^\top$",
           r"$\partial (h + f(h)) / \partial h = \mathrm{Id} + \partial f / \partial h$",
           r"\left(\mathrm{Id} - \frac{\mathbf{1}\mathbf{1}^\top}{H}", r"$HI + I$ and $IH + H$", r"$I = 4H$"]
    for text in new:
        assert not forbidden_uses(text), (text, forbidden_uses(text))


def _figure_labels(path: Path) -> str:
    """The strings a chapter's plotting code puts on axes and titles."""
    return "\n".join(re.findall(r"(?:set_[xy]?label|[xy]label\s*=|set_title|title\s*=)\s*\(?\s*f?\"([^\"]*)\"",
                                "\n".join(_code(path))))


@pytest.mark.parametrize("path", CHAPTERS + [ROOT / p for p in ("notation.md", "glossary.md", "paper_map.md")], **_ids)
def test_one_meaning_per_symbol(path):
    text = _markdown(path)
    if path.suffix == ".ipynb":
        text += "\n" + _figure_labels(path)
    found = forbidden_uses(text)
    assert not found, f"{path.name} gives a letter a meaning notation.md does not:\n" + "\n".join(found)


# --------------------------------------------------------------------- numbers about the model are computed

_NUMBER = r"(?:(?<![\w.{`-])[-−+]?\d[\d,]*(?:\.\d+)?(?:e[-−+]?\d+)?(?!\.?x\b)(?![\w-])(?:\s*%|×)?|`(?:True|False)`)"
#: The subject of a sentence about the checkpoint in use or this run.
_ABOUT_THIS_MODEL = [
    r"\bhere,? (?:it|this|that|they|the \w+) (?:is|are|was|were|gives?|reaches|comes to)\b",
    r"\bhere\b[^.;:!?\n]{0,60}\b(?:is|are|was|were|reaches|gives|scores)\s+(?:about |roughly |only |just |at most "
    r"|at least )?(?=[-−+]?\d|`)",
    r"\b(?:this|the) (?:checkpoint|model)(?: in use| on this page)\b", r"\bthis (?:checkpoint|model|run)\b",
    r"\b(?:this|the default) (?:checkpoint|model)'s\b", r"\bthe default (?:checkpoint|model)\b",
    r"\bon this (?:model|checkpoint|page|run|machine)\b", r"\bin this run\b",
]
UNGLUED_CLAIM = re.compile(r"(?:" + "|".join(_ABOUT_THIS_MODEL) + r")[^.;:!?\n]{0,100}?" + _NUMBER, re.I)
#: What is not a measured number: references (chapter 4, section 8.3, Figure 9.2), glued values, citations, math
#: and inline code (but `True`/`False` in code font is a value).
_NOT_A_MEASUREMENT = re.compile(
    r"\b(?:chapters?|sections?|§|Figure|Table|Exercise|appendix|part|step|equation|eq\.)\s*\d+[a-z]?(?:\.\d+)*"
    r"(?:\s*(?:and|to|-|–)\s*\d+[a-z]?(?:\.\d+)*)?|\{(?:glue|ref|doc|cite|term|numref)[:\w]*\}`[^`]*`|\$[^$\n]*\$"
    r"|`(?!(?:True|False)`)[^`\n]*`", re.I)


def unglued_claims(markdown: str) -> list[str]:
    """Sentences that state a number about the checkpoint in use or this run, typed instead of glued."""
    text = _NOT_A_MEASUREMENT.sub(" ", markdown)
    return ["…" + " ".join(m.group(0).split()) + "…" for m in UNGLUED_CLAIM.finditer(text)]


def test_unglued_claims_are_found():
    bad = ["Its flag `pt.pooler_in_checkpoint` says whether the checkpoint stores a pooler: here it is `False`.",
           "On this model the gap is 0.15.", "This checkpoint reaches 0.535 after four epochs.",
           "Here the largest difference is 3e-6.", "The model in use has 6 layers.", "In this run it took 45 s."]
    good = ["Here it is {glue:text}`ch08_pooler_stored`.", "This checkpoint is described in chapter 9.",
            "On this model the gap is {glue:text}`ch08_gap`.", "Here is the 4.x code.",
            "BERT-base has 12 layers {cite}`devlin2019bert`.", "The default model stores a pooler (section 8.3)."]
    for text in bad:
        assert unglued_claims(text), text
    for text in good:
        assert not unglued_claims(text), (text, unglued_claims(text))


@pytest.mark.parametrize("path", CHAPTERS, **_ids)
def test_numbers_about_the_model_are_glued(path):
    found = unglued_claims(_markdown(path))
    assert not found, (f"{path.name}: a number about the checkpoint in use or this run is typed; compute it on the "
                       "page and glue it (or state a general fact with a citation):\n" + "\n".join(found))


# ------------------------------------------------------------------------------------ one home for each topic

#: The labels that mark a topic's one home (a `(label)=` line before its heading); other chapters link with
#: {ref}`label` instead of explaining the topic again.
HOMES = {"how-we-check": "01b_bert_by_hand", "permutation-equivariance": "02_embeddings",
         "dropout-explained": "03_layer_norm", "head-split": "05_multi_head_attention",
         "gelu-exact-vs-tanh": "06_encoder_layer", "previous-token-head": "07_encoder", "pooler-cases": "08_pooler"}


def _labels(path: Path) -> set[str]:
    return set(re.findall(r"^\(([\w-]+)\)=\s*$", _markdown(path), re.M))


def test_each_topic_has_its_home():
    for label, stem in HOMES.items():
        assert label in _labels(ROOT / "chapters" / f"{stem}.ipynb"), f"{stem} lost its label ({label})="


def test_every_ref_has_a_target():
    pages = [ROOT / f"{f}{suffix}" for f in toc_files() for suffix in (".md", ".ipynb")
             if (ROOT / f"{f}{suffix}").exists()]
    defined = set().union(*(_labels(p) for p in pages))
    missing = []
    for path in pages:
        for ref in re.findall(r"\{ref\}`([^`]*)`", _markdown(path)):
            target = m.group(1) if (m := re.search(r"<([^>]+)>\s*$", ref)) else ref
            if target.strip() not in defined:
                missing.append(f"{path.name}: {{ref}}`{ref}`")
    assert not missing, "references to labels no page defines (a build error under -n):\n" + "\n".join(missing)


def _numbered(pattern: str) -> set[str]:
    return {m for path in CHAPTERS for m in re.findall(pattern, _markdown(path), re.M)}


def test_numbered_references_have_targets():
    """Every "section N.M" (or §N.M), "Figure N.M" and "Exercise N.M" a chapter cites exists: a heading
    ``## N.M``, a caption ``Figure N.M:``, an exercise ``**Exercise N.M``. Renumbering a chapter's figures or
    sections without its references fails here, not in a reader's hands."""
    targets = {"section": _numbered(r"^#{2,3} (\d+b?\.\d+)\b"),
               "figure": _numbered(r"Figure (\d+b?\.\d+)(?: \(going further\))?:"),
               "exercise": _numbered(r"\*\*Exercise (\d+b?\.\d+)\b")}
    cited = {"section": r"\b(?:[Ss]ections?|§)\s?(\d+b?\.\d+)\b", "figure": r"\bFigures? (\d+b?\.\d+)\b",
             "exercise": r"\bExercises? (\d+b?\.\d+)\b"}
    missing = [f"{path.name}: {kind} {number}" for path in CHAPTERS
               for kind, pattern in cited.items()
               for number in re.findall(pattern, _markdown(path) + "\n".join(_code(path)))
               if number not in targets[kind]]
    assert all(targets.values()) and not missing, "references to nothing:\n" + "\n".join(missing)


def test_section_links_name_their_section():
    """A {ref} written as "section N.M <label>" names the heading its label marks."""
    heading = {}
    for path in CHAPTERS:
        for label, number in re.findall(r"^\(([\w-]+)\)=\s*\n#{2,3} (\d+b?\.\d+)\b", _markdown(path), re.M):
            heading[label] = number
    wrong = [f"{path.name}: section {number} <{label}> is section {heading.get(label)}"
             for path in CHAPTERS for number, label in re.findall(r"\{ref\}`section (\S+) <([\w-]+)>`",
                                                                   _markdown(path))
             if heading.get(label) != number]
    assert not wrong, "\n".join(wrong)


#: notation.md's one depth axis: a plot over depth is over ℓ of h^(ℓ), with 0 for the embeddings.
DEPTH_AXIS = "ℓ: hidden state h^(ℓ) (0 = the embeddings)"


@pytest.mark.parametrize("path", CHAPTERS, **_ids)
def test_depth_axes_use_one_label(path):
    labels = re.findall(r"(?:set_xlabel\(|xlabel\s*=\s*)f?\"([^\"]*)\"", "\n".join(_code(path)))
    other = [label for label in labels if re.search(r"hidden.?states?|after (each |the )?layer|ℓ", label)
             and label != DEPTH_AXIS]
    assert not other, f"{path.name}: depth axes are labelled {DEPTH_AXIS!r} (notation.md, ℓ), not {other}"


# ------------------------------------------------------------------------------ a claim's status, in its sentence

#: Where a chapter glues ``Observation.status`` (bertlib.course.claims): the word before the glue, the glue, and
#: the character after it.
_STATUS_GLUE = re.compile(r"(\w+)\s+\{glue:text\}`(ch\w+_status)`(.?)")


def _status_phrases() -> list[str]:
    from bertlib.course.claims import UNNAMED, Observation

    measured_on = ("all-MiniLM-L6-v2", "paraphrase-MiniLM-L3-v2")
    return [Observation("c", 18.0, 5.0, True, name, asserted, measured_on).status
            for name, asserted in [("all-MiniLM-L6-v2", True), ("m3e-small", False), (UNNAMED, False)]]


def _trigrams(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[\w-]+", text.lower())
    return {tuple(words[i:i + 3]) for i in range(len(words) - 2)}


def test_claim_status_reads_in_its_sentence():
    """Every sentence that glues a claim's status reads as English with each of the phrases the claim can produce
    (asserted on a measured checkpoint; reported on another, named or not): the glue completes "here it is",
    "they are", "both bounds are" or "here", is followed by punctuation with no space before it, and the phrase
    repeats no three words of its sentence (it used to repeat "where its margin was measured")."""
    phrases = _status_phrases()
    assert all("measured" not in p and not p.endswith((".", " ")) for p in phrases), phrases
    seen = 0
    for path in CHAPTERS:
        text = _markdown(path)
        for m in _STATUS_GLUE.finditer(text):
            if m.group(2) == "ch13_gap_status":          # chapter 13 glues its own sentence, not a claim's status
                continue
            seen += 1
            where = f"{path.name}, {m.group(2)}"
            assert m.group(1) in {"is", "are", "here", "Here"}, f"{where}: the status follows {m.group(1)!r}"
            assert m.group(3) in {".", ",", ";", ")"}, f"{where}: {m.group(3)!r} after the status (no space)"
            start = max(text.rfind(". ", 0, m.start()), text.rfind(".\n", 0, m.start())) + 1
            before = text[start:m.start()]
            for phrase in phrases:
                repeated = _trigrams(before) & _trigrams(phrase)
                assert not repeated, f"{where}: {phrase!r} repeats {sorted(repeated)} of {' '.join(before.split())!r}"
    assert seen >= 8, f"only {seen} glued claim statuses found: did the glue names change?"


# --------------------------------------------------------------------- what the build adds to a page, for a reader

#: Words of the project's tooling that a reader of the book cannot act on.
DEVELOPER_WORDS = [r"\bmake \w+", r"\bnbval\b", r"\btests/", r"jupyter_cache", r"\bpytest\b", r"_build/"]


def test_the_run_time_box_speaks_to_a_reader():
    """The box at the end of every chapter (_ext/bertbook/measure.py) keeps its facts (time, profile, device,
    memory, machine) and says them without build commands or test tools, from the book build or from the cache."""
    measure = pytest.importorskip("bertbook.measure", reason="the book extras (sphinx) are not installed")
    full = dict(runtime_s=7.2, profile="quick", device="cpu", cpu_count=2, cpu_model="AMD EPYC", torch_threads=1,
                python="3.11.7", torch="2.13.0+cpu", transformers="5.23.0", peak_rss_mib=1454.0, executed_by="nbval")
    for record in (full, dict(full, executed_by=None), {"runtime_s": 3.0}):
        text = " ".join(measure.describe(record))
        assert re.search(r"ran in \d+(\.\d+)? s", text) and "On a GPU" in text, text
        found = _hits(DEVELOPER_WORDS, text)
        assert not found, f"developer language in a reader's box: {found}"
    text = measure.describe(full)[0]
    assert "executed when the book was built" in text and "1 torch thread," in text and "1.42 GiB" in text, text


def test_figures_carry_only_the_chapters_numbers():
    """A figure's caption starts with its chapter's number ("Figure 4.1"), typed by the chapter: ``_config.yml`` keeps
    Sphinx's numbering off, and the book's extension keeps it off after ``sphinx_jupyterbook_latex`` (which Jupyter
    Book loads) turns it on for every builder at config-inited, its default priority 500. Without that, every
    caption read "Fig. 2 Figure 0.1". The browser test checks the built pages (no ``caption-number``)."""
    bertbook = pytest.importorskip("bertbook", reason="the book extras (sphinx) are not installed")
    from types import SimpleNamespace

    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    assert config["sphinx"]["config"]["numfig"] is False

    connected = []
    bertbook.setup(SimpleNamespace(connect=lambda event, fn, priority=500: connected.append((event, fn, priority))))
    late = [(fn, p) for event, fn, p in connected if event == "config-inited" and p > 500]
    sphinx_config = SimpleNamespace(numfig=True)            # as sphinx_jupyterbook_latex leaves it
    for fn, _ in late:
        fn(None, sphinx_config)
    assert late and sphinx_config.numfig is False, "nothing turns numfig off after sphinx_jupyterbook_latex"
