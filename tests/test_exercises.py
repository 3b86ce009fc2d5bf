"""Every exercise can be attempted before its solution is opened (issue 25): the structure, read from the notebooks.

The dynamic half (each check fails friendly without an answer and fails with a wrong one) runs inside nbval's
execution of the chapters (``tests/nbval_learner.py``). This file checks, without running anything:

- each coded exercise is starter → solution → check, the check starts with ``check_answers("N.M", ...)`` naming
  the exercise of its prompt, and the starter sets every answer it names;
- every name a check cell reads is defined by a visible cell above it (a learner never has the solution's names);
- every exercise prompt is marked ★, ★★ or ★★★, and each chapter has at least one open exercise;
- ``bertlib.course.exercises`` gives the friendly message and makes wrong answers of every supported type.
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
