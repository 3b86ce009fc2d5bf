"""pytest plugin: every exercise check runs in *learner mode* while nbval executes the chapter.

``make test`` loads it (``-p tests.nbval_learner``). An exercise is a visible starter cell (tag
``exercise-starter``, answers set to ``None``), a hidden solution cell (tag ``solution``) and a visible check cell
(tag ``exercise-check``) that starts with ``check_answers("N.M", name=name, ...)`` (``bertlib.course.exercises``).
Inside the
one kernel nbval runs, this plugin adds runs of each check to the chapter's own, without executing anything
twice:

- just before the solution cell: the check with every answer ``None`` (what a learner who has not written the
  answer runs) must raise ``ExerciseIncomplete``, with its friendly message, not ``NameError`` and not pass;
- just before the check cell: the check with each answer replaced by a deliberately wrong one
  (``bertlib.course.exercises.wrong_answer``) must fail;
- then the *lazy pass* (``bertlib.course.exercises.lazy_pass``): the check with each answer in turn replaced by every
value
  the page already holds of the same kind and shape (visible variables and the items of their containers, e.g.
  ``ref.hidden_states[3]``; not the answers, not what the solution cell bound) must fail for each. This also finds
  the value the check compares against whenever the page holds it. The names the solution bound are those the
  kernel's namespace gained or rebound between the first run (just before the solution) and this one;

then the chapter's check runs as written and must pass. The checks run in a copy of the notebook's namespace, print
nothing and leave no variable behind, so the outputs the book renders are the chapter's own. ``tests/test_exercises.py``
checks the same structure statically (the names a check reads are defined by the visible cells).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass

import pytest

STARTER, SOLUTION, CHECK = "exercise-starter", "solution", "exercise-check"


@dataclass
class Exercise:
    """One coded exercise: its id (``"4.1"``), the answers its check names, and its cells' indices and source."""

    exercise: str
    answers: list[str]
    starter: int
    solution: int
    check: int
    check_source: str


def tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def source(cell) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def check_call(check_source: str) -> tuple[str, list[str]]:
    """``("4.1", ["probs_h", "context_h"])`` from the check cell's first statement, ``check_answers("4.1", ...)``.

    Raises ``ValueError`` when the first statement is not such a call, with every answer passed as ``name=name``.
    """
    body = ast.parse(check_source).body
    first = body[0] if body else None
    call = first.value if isinstance(first, ast.Expr) else None
    if not (isinstance(call, ast.Call) and getattr(call.func, "id", getattr(call.func, "attr", None)) == "check_answers"
            and len(call.args) == 1 and isinstance(call.args[0], ast.Constant) and call.keywords):
        raise ValueError('the first statement of a check cell must be check_answers("N.M", answer=answer, ...)')
    names = []
    for kw in call.keywords:
        if not (isinstance(kw.value, ast.Name) and kw.value.id == kw.arg):
            raise ValueError(f"check_answers takes each answer as name=name, got {kw.arg}=...")
        names.append(kw.arg)
    return str(call.args[0].value), names


def exercises(cells: list) -> list[Exercise]:
    """The coded exercises of a notebook's cells (nbformat nodes or plain dicts), in order.

    Each solution cell must come right after its starter cell (markdown between them is allowed) and right before
    its check cell; ``ValueError`` names the first cell that breaks the pattern.
    """
    code = [(i, c) for i, c in enumerate(cells) if c.get("cell_type") == "code"]
    found = []
    for pos, (i, cell) in enumerate(code):
        if SOLUTION not in tags(cell):
            continue
        before = code[pos - 1] if pos > 0 else None
        after = code[pos + 1] if pos + 1 < len(code) else None
        if before is None or STARTER not in tags(before[1]):
            raise ValueError(f"cell {i}: a solution cell must follow its exercise's starter cell (tag {STARTER!r})")
        if after is None or CHECK not in tags(after[1]):
            raise ValueError(f"cell {i}: a solution cell must be followed by its check cell (tag {CHECK!r})")
        exercise, answers = check_call(source(after[1]))
        found.append(Exercise(exercise, answers, before[0], i, after[0], source(after[1])))
    return found


def _learner_code(ex: Exercise, stage: str) -> str:
    args = ", ".join(json.dumps(v) for v in (ex.exercise, stage, ex.check_source))
    return (f"__import__('bertlib.course.exercises').course.exercises.learner_mode({args}, {ex.answers!r}, globals())"
            "  # learner mode (tests/nbval_learner.py)\n")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(LearnerMode(), "nbval-learner")


class LearnerMode:
    """Prefixes the solution and check cells' code with the learner-mode runs of their check (restored after)."""

    def __init__(self) -> None:
        self.by_notebook: dict[int, dict[int, tuple[Exercise, str]]] = {}

    def plan(self, notebook) -> dict[int, tuple[Exercise, str]]:
        key = id(notebook)
        if key not in self.by_notebook:
            plan: dict[int, tuple[Exercise, str]] = {}
            for ex in exercises(notebook.nb.cells):
                plan[ex.solution] = (ex, "missing")
                plan[ex.check] = (ex, "wrong")
            self.by_notebook[key] = plan
        return self.by_notebook[key]

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        if type(item).__name__ != "IPyNbCell":
            yield
            return
        index = next(i for i, c in enumerate(item.parent.nb.cells) if c is item.cell)
        step = self.plan(item.parent).get(index)
        if step is None:
            yield
            return
        original = item.cell.source
        item.cell.source = _learner_code(*step) + original
        try:
            yield
        finally:
            item.cell.source = original
