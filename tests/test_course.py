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

import prose
from toc import ROOT, notebooks, toc_files

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


def test_the_appendix_comes_last():
    chapters = [f for f in toc_files() if f.startswith("chapters/") and f != "chapters/bibliography"]
    assert chapters[-1] == "chapters/14_making_it_fast", chapters
    assert chapters.index("chapters/15_bert_family") < chapters.index("chapters/14_making_it_fast")
    if (ROOT / "chapters/09b_long_documents.ipynb").exists():
        assert chapters.index("chapters/09b_long_documents") == chapters.index("chapters/09_20newsgroups") + 1
