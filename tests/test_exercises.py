"""Every exercise can be attempted before its solution is opened (issues 25, 35): the structure, read statically.

The dynamic half (each check fails friendly without an answer and fails with a wrong one) runs inside nbval's
execution of the chapters (``tests/nbval_learner.py``). This file checks, without running anything:

- each coded exercise is starter → solution → check, the check starts with ``check_answers("N.M", ...)`` naming
  the exercise of its prompt, and the starter sets every answer it names;
- every name a check cell reads is defined by a visible cell above it (a learner never has the solution's names);
- every exercise prompt is marked ★, ★★ or ★★★, and each chapter has at least one open exercise;
- no check cell shows the value it compares against while an answer is wrong, and no starter cell contains the
  solution's code (issue 35);
- ``bertlib.course.exercises`` gives the friendly message, makes wrong answers of every supported type, finds an answer
  the page already holds (the lazy pass) and compares predictions.
"""

from __future__ import annotations

import ast
import builtins
import re

import nbformat
import numpy as np
import pytest
import torch

from bertlib.course.exercises import ExerciseIncomplete, check_answers, learner_mode, wrong_answer
from nbval_learner import CHECK, SOLUTION, STARTER, exercises, source, tags
from toc import notebooks

CHAPTERS = [p for p in notebooks() if p.parent.name == "chapters"]
PROMPT = re.compile(r"\*\*Exercise (\d+[a-z]?\.\d+)\s*(★{1,3})?")


def _code(text: str) -> str:
    """Cell source without IPython magics and shell escapes, so that ``ast`` can read it."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in text.splitlines())


def defined_names(text: str) -> set[str]:
    """Names a cell binds: assignments, imports, ``def``/``class``, loop and ``with`` targets."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(_code(text))):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.arg):  # a parameter of a function or lambda defined in the cell
            names.add(node.arg)
    return names


def read_names(text: str) -> set[str]:
    """Names a cell reads that it does not bind itself (its free names)."""
    tree = ast.parse(_code(text))
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loads - defined_names(text) - set(dir(builtins))


def load(path):
    return nbformat.read(str(path), as_version=4)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_exercise_structure(path):
    nb = load(path)
    found = exercises(nb.cells)  # raises on a broken starter → solution → check pattern
    prompts = [(i, m) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
               for m in PROMPT.finditer(source(c))]
    assert prompts, f"{path.name}: no exercises"
    unmarked = [m.group(1) for _, m in prompts if not m.group(2)]
    assert not unmarked, f"{path.name}: exercises without a ★ difficulty mark: {unmarked}"
    for ex in found:
        before = [m.group(1) for i, m in prompts if i < ex.starter]
        assert before and before[-1] == ex.exercise, (
            f"{path.name}: the check of exercise {ex.exercise} follows the prompt of exercise {before[-1:]}")
        starter = defined_names(source(nb.cells[ex.starter]))
        unset = [a for a in ex.answers if a not in starter]
        assert not unset, f"{path.name}, exercise {ex.exercise}: the starter cell does not set {unset}"
    coded = {ex.exercise for ex in found}
    open_ones = [m.group(1) for _, m in prompts if m.group(1) not in coded]
    assert open_ones, f"{path.name}: no open exercise (a prompt with a discussion, no check cell)"
    stray = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and {STARTER, CHECK} & set(tags(c))
             and not any(i in (ex.starter, ex.check) for ex in found)]
    assert not stray, f"{path.name}: starter or check cells outside a starter → solution → check triple: {stray}"
    first = prompts[0][0]
    hidden = [i for i, c in enumerate(nb.cells) if i > first and c.cell_type == "code" and "hide-input" in tags(c)
              and not any(i == ex.solution for ex in found)]
    assert not hidden, (f"{path.name}: hidden code cells among the exercises that are not a solution of a "
                        f"starter → solution → check triple: {hidden}")


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_checks_read_only_visible_names(path):
    """A learner has run every visible cell and no solution: a check may read only what those cells define."""
    nb = load(path)
    visible: set[str] = set()
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        text = source(cell)
        if CHECK in tags(cell):
            unknown = read_names(text) - visible
            if unknown:
                problems.append(f"cell {i} reads {sorted(unknown)}, defined only by a solution cell (or nowhere)")
        if SOLUTION not in tags(cell):
            visible |= defined_names(text)
    assert not problems, f"{path.name}: " + "; ".join(problems)


def test_check_answers_is_friendly():
    with pytest.raises(ExerciseIncomplete, match=r"Exercise 4\.1: `probs_h` is still None"):
        check_answers("4.1", probs_h=None, context_h=torch.zeros(1))
    with pytest.raises(ExerciseIncomplete, match="`a`, `b` are still None"):
        check_answers("1.1", a=None, b=None)
    check_answers("1.1", a=0, b=False)  # falsy answers are answers


@pytest.mark.parametrize("value", [
    torch.randn(2, 3), torch.arange(4), torch.tensor([True, False]), np.arange(3.0), 3, 0.25, True, "##ing",
    [torch.ones(2), 1], (1, 2.0), {"a": torch.zeros(2)},
])
def test_wrong_answer_differs(value):
    def differs(wrong, right) -> bool:
        assert type(wrong) is type(right)
        if isinstance(right, torch.Tensor | np.ndarray):
            assert wrong.shape == right.shape and wrong.dtype == right.dtype
            return bool((wrong != right).all())
        if isinstance(right, list | tuple):
            return all(differs(w, r) for w, r in zip(wrong, right, strict=True))
        if isinstance(right, dict):
            return wrong.keys() == right.keys() and all(differs(wrong[k], right[k]) for k in right)
        return wrong != right

    assert differs(wrong_answer(value), value)


def test_wrong_answer_of_a_function():
    def double(x):
        return 2 * x

    assert wrong_answer(double)(torch.ones(3)).ne(2).all()
    with pytest.raises(TypeError, match="cannot make a wrong answer"):
        wrong_answer(object())


def test_learner_mode_catches_checks_that_cannot_fail():
    good = 'check_answers("0.1", y=y)\nassert abs(y - 2 * x) < 1e-9\n'
    ns = {"check_answers": check_answers, "x": 1.0, "y": 2.0}
    learner_mode("0.1", "missing", good, ["y"], ns)
    learner_mode("0.1", "wrong", good, ["y"], ns)
    with pytest.raises(AssertionError, match="with a wrong answer the check passed"):
        learner_mode("0.1", "wrong", 'check_answers("0.1", y=y)\nassert y is not None\n', ["y"], ns)
    with pytest.raises(AssertionError, match="with no answer the check raised NameError"):
        learner_mode("0.1", "missing", "assert abs(y - 2 * z) < 1\n", ["y"], ns)


def test_lazy_pass_finds_an_answer_the_page_holds():
    """The lazy pass: a check that accepts a page variable, or an item of one, fails learner mode; a good one passes."""
    x = torch.randn(2, 3)
    ns = {"check_answers": check_answers, "torch": torch, "x": x, "out": {"hidden": (x.neg(), x * 2)},
          "n_tokens": 3, "other": torch.randn(2, 3), "flag": True}
    copyable = 'check_answers("0.2", y=y)\ntorch.testing.assert_close(y, 2 * x)\n'
    learner_mode("0.2", "missing", copyable, ["y"], ns)
    ns["y"] = 2 * x  # the solution
    with pytest.raises(AssertionError, match=r"page already holds \(`y` = `out\['hidden'\]\[1\]`\)"):
        learner_mode("0.2", "wrong", copyable, ["y"], ns)
    needs_work = 'check_answers("0.2", y=y)\ntorch.testing.assert_close(y, 3 * x)\n'
    ns.pop("y")
    learner_mode("0.2", "missing", needs_work, ["y"], ns)
    ns["y"], ns["helper"] = 3 * x, 3 * x  # what the solution binds is not on the learner's page
    learner_mode("0.2", "wrong", needs_work, ["y"], ns)


def test_lazy_candidates_match_kind_and_shape():
    from bertlib.course.exercises import lazy_candidates

    ns = {"a": torch.zeros(2, 3), "b": torch.zeros(3, 2), "c": torch.zeros(2, 3, dtype=torch.int64), "d": 4,
          "e": 4.0, "f": True, "g": [torch.ones(2, 3)], "alias": None}
    ns["alias"] = ns["a"]
    labels = lambda answer: [label for label, _ in lazy_candidates(answer, ns, set())]  # noqa: E731
    assert labels(torch.ones(2, 3)) == ["g[0]", "a"]  # nearest first, one of two aliases
    assert labels(5) == ["d"] and labels(5.0) == ["e"] and labels(False) == []
    assert labels(torch.ones(2, 3, dtype=torch.int64)) == ["c"]


def _is_check_statement(node: ast.stmt) -> bool:
    """An ``assert`` or a call of an ``assert_*`` function (``assert_close``, ``np.testing.assert_allclose``)."""
    if isinstance(node, ast.Assert):
        return True
    call = node.value if isinstance(node, ast.Expr) else None
    func = call.func if isinstance(call, ast.Call) else None
    return getattr(func, "id", getattr(func, "attr", "")).startswith("assert")


_SHOWS_SHAPE = {"shape", "dtype", "ndim"}
_PLAIN_CALLS = {"len", "type", "tuple", "list", "round", "int", "float", "str", "repr", "abs", "sorted"}


def _shows_reference(node: ast.AST, bound: set[str], answers: set[str]) -> bool:
    """Whether formatting ``node`` can show the reference: a name the check bound (other than through ``.shape`` or
    ``len``), or a computation on the page's values that does not start from a learner's answer."""
    if isinstance(node, ast.Name):
        return node.id in bound
    if isinstance(node, ast.Attribute) and node.attr in _SHOWS_SHAPE or isinstance(node, ast.Constant):
        return False
    base = node
    while isinstance(base, ast.Subscript):
        base = base.value
    if base is not node and isinstance(base, ast.Name) and base.id in answers:
        return False  # an item of the learner's own answer
    if isinstance(node, ast.Call):
        name = getattr(node.func, "id", None)
        if name in ("len", "type"):
            return False
        reads = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        if name not in _PLAIN_CALLS and not reads & answers:
            return True  # a new computation on the page's values: it could be the reference
    return any(_shows_reference(child, bound, answers) for child in ast.iter_child_nodes(node))


def revealing_messages(check_source: str, answers: list[str]) -> list[str]:
    """What in a check cell could show a learner the expected value before their answer is right.

    - an assertion message (``assert ..., msg`` or ``assert_close(..., msg=...)``) that formats a value the check
      computed (``f"the rows that change are {actual_rows}"``): shapes and lengths are fine, and so are the
      learner's answers and what the page shows anyway;
    - a ``print`` before the cell's last assertion that shows such a value: it runs, and shows the reference, while
      a later assertion still fails.
    """
    tree = ast.parse(_code(check_source))
    loops = {n.id for f in ast.walk(tree) if isinstance(f, ast.For)
             for n in ast.walk(f.target) if isinstance(n, ast.Name)}
    bound = defined_names(check_source) - set(answers) - loops  # a loop's variable runs over what the page gives
    answer_names = set(answers)

    def shows(node: ast.AST | None) -> bool:
        if node is None:
            return False
        if isinstance(node, ast.JoinedStr):
            return any(_shows_reference(v.value, bound, answer_names)
                       for v in node.values if isinstance(v, ast.FormattedValue))
        return not isinstance(node, ast.Constant) and _shows_reference(node, bound, answer_names)

    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert) and shows(node.msg):
            problems.append(f"line {node.lineno}: the assertion message shows a value the check computed")
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "msg" and shows(kw.value):
                    problems.append(f"line {node.lineno}: msg= shows a value the check computed")
    last = max((s.lineno for s in tree.body if _is_check_statement(s)), default=0)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print" and node.lineno < last
                and any(shows(a) for a in node.args)):
            problems.append(f"line {node.lineno}: print before the last assertion shows a value the check computed")
    return problems


def leaked_solution_lines(starter: str, solution: str, min_chars: int = 20) -> list[str]:
    """The solution's code that the starter cell gives away: names and shapes only, never the computation.

    A line of the solution (or the right-hand side of one of its assignments) at least ``min_chars`` long without
    spaces that appears in the starter, comments included; or a call of the solution, half that long, that
    appears in the starter's comments (``q_all.view(B, A, T, d)``).
    """
    squeeze = lambda text: re.sub(r"\s+", "", text)  # noqa: E731
    starter_text = squeeze(starter)
    leaked = []
    for line in solution.splitlines():
        code = line.split("  #")[0].strip()
        pieces = [code] + ([code.split("=", 1)[1]] if re.match(r"^[\w, ()\[\]]+=[^=]", code) else [])
        if any(len(squeeze(p)) >= min_chars and squeeze(p) in starter_text for p in pieces):
            leaked.append(code)
    calls = {squeeze(ast.unparse(n)) for n in ast.walk(ast.parse(_code(solution))) if isinstance(n, ast.Call)}
    given = {squeeze(ast.unparse(n)) for n in ast.walk(ast.parse(_code(starter))) if isinstance(n, ast.Call)}
    leaked += [c for c in sorted(calls - given) if len(c) >= min_chars // 2 and c in starter_text]  # in a comment
    return leaked


# Checks known to give their answer away while a branch fixes them (their ids, e.g. "9b.1"): none now.
GIVE_AWAY_PENDING: set[str] = set()


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_checks_and_starters_do_not_give_the_answer_away(path):
    """Checks never print the expected value; starter cells give names and shapes, never the computation."""
    nb = load(path)
    problems = []
    for ex in exercises(nb.cells):
        if ex.exercise in GIVE_AWAY_PENDING:
            continue
        for problem in revealing_messages(source(nb.cells[ex.check]), ex.answers):
            problems.append(f"exercise {ex.exercise}, check {problem}")
        for line in leaked_solution_lines(source(nb.cells[ex.starter]), source(nb.cells[ex.solution])):
            problems.append(f"exercise {ex.exercise}: the starter contains the solution's code {line!r}")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_the_give_away_detectors():
    check = ('check_answers("0.1", y=y)\nref = 2 * x\nprint(f"{y} vs {ref}")\n'
             'assert y == ref, f"expected {ref}"\nassert_close(y, ref, msg=f"{y.shape}")\n')
    found = revealing_messages(check, ["y"])
    assert len(found) == 2 and "line 3: print" in found[1] and "line 4: the assertion" in found[0]
    fine = 'check_answers("0.1", y=y)\nassert y == 2 * x, f"your y is {y}, x is {x}"\nprint(x)\nassert y > 0\n'
    assert revealing_messages(fine, ["y"]) == []
    assert revealing_messages('assert y == f(x), f"not {f(x)}"\n', ["y"])  # computes the reference
    solution = "probs = torch.softmax(scores / math.sqrt(d), dim=-1)  # the rows\nk = 3\n"
    assert leaked_solution_lines("probs = None  # torch.softmax(scores / math.sqrt(d), dim=-1)\n", solution)
    assert not leaked_solution_lines("probs = None  # (batch, seq, seq): softmax of the scaled scores\n", solution)
    assert leaked_solution_lines("k = None  # q.view(B, T, A, d)\n", "k = q.view(B, T, A, d).permute(0, 2, 1, 3)\n")


def test_check_prediction_bands_and_lazy_pass():
    from bertlib.course.exercises import check_prediction

    check_prediction("0.3", 0.3, 0.35, within=0.1)
    check_prediction("0.3", 2.0, 2.9, factor=1.5)
    with pytest.raises(AssertionError, match="too high") as high:
        check_prediction("0.3", 0.5, 0.35, within=0.1)
    assert "0.35" not in str(high.value)  # never the measured value
    with pytest.raises(AssertionError, match="too low"):
        check_prediction("0.3", 1.0, 2.9, factor=1.5)
    with pytest.raises(AssertionError, match="a prediction is a number"):
        check_prediction("0.3", True, 1.0, within=0.1)
    with pytest.raises(AssertionError, match="a finite number"):
        check_prediction("0.3", float("nan"), 1.0, within=0.1)  # NaN compares False with every bound
    # the lazy pass: a page number in the band by chance is not the answer; the measured value itself is
    check = ('check_answers("0.3", guess=guess)\nmeasured = float(x.mean())\n'
             '__import__("bertlib.course.exercises").course.exercises.check_prediction("0.3", guess, measured, '
             'within=0.1)\n')
    x = torch.tensor([0.2, 0.4])
    ns = {"check_answers": check_answers, "x": x, "nearby": 0.31}
    learner_mode("0.3", "missing", check, ["guess"], ns)
    ns["guess"] = 0.3
    learner_mode("0.3", "wrong", check, ["guess"], ns)
    ns.pop("guess")
    ns["shown"] = float(x.mean())  # the page prints the measured value: the prediction is given away
    learner_mode("0.3", "missing", check, ["guess"], ns)
    ns["guess"] = 0.3
    with pytest.raises(AssertionError, match="`guess` = `shown`"):
        learner_mode("0.3", "wrong", check, ["guess"], ns)
