"""Exercise checks that a learner can run before writing an answer (every chapter's *Exercises* section).

An exercise in a chapter is four cells: a visible *starter* cell that sets every answer to ``None``, a hidden
*solution* cell, a visible *check* cell that starts with :func:`check_answers`, and the explanation. A learner
writes code in the starter cell and runs the check; an answer still ``None`` gives a friendly
:class:`ExerciseIncomplete` instead of a ``NameError`` from deep inside the check.

:func:`wrong_answer` and :func:`run_check` serve ``tests/nbval_learner.py``, which runs every check in *learner mode*
while nbval executes the chapter: without the solution the check must fail with :class:`ExerciseIncomplete`, and
with a deliberately wrong answer it must fail too.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch


class ExerciseIncomplete(AssertionError):
    """An answer of an exercise is still missing (``None``): the learner has not written it yet."""


def check_answers(exercise: str, **answers: Any) -> None:
    """Raise :class:`ExerciseIncomplete` naming each answer of ``exercise`` (e.g. ``"4.1"``) that is still ``None``.

    Call it first in an exercise's check cell, with every answer the check reads:
    ``check_answers("4.1", probs_h=probs_h, context_h=context_h)``.
    """
    missing = [name for name, value in answers.items() if value is None]
    if missing:
        names = ", ".join(f"`{name}`" for name in missing)
        verb = "is" if len(missing) == 1 else "are"
        raise ExerciseIncomplete(
            f"Exercise {exercise}: {names} {verb} still None: compute {'it' if len(missing) == 1 else 'them'} in "
            "the starter cell above, run that cell, then run this check again (the collapsed cell between them "
            "is our solution: open it only when you are stuck)."
        )


def wrong_answer(value: Any, *, seed: int = 0) -> Any:
    """A deliberately wrong version of an answer, of the same type and shape, for testing that a check can fail.

    Tensors and arrays: floats get ``+ 1`` plus seeded noise (so ratios, argmaxes and sums all move), integers
    ``+ 1``, booleans are flipped; Python numbers, strings and booleans change likewise; containers element-wise;
    a callable returns wrong outputs. Anything else raises ``TypeError``: keep answers to these types.
    """
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bool:
            return ~value
        if not value.is_floating_point():
            return value + 1
        g = torch.Generator().manual_seed(seed)
        noise = torch.randn(value.shape, generator=g).to(device=value.device, dtype=value.dtype)
        return value + 1 + 0.5 * noise
    if isinstance(value, np.ndarray | np.generic):
        return wrong_answer(torch.as_tensor(np.asarray(value)), seed=seed).numpy().astype(np.asarray(value).dtype)
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 1.0
    if isinstance(value, str):
        return value + " (wrong)"
    if isinstance(value, list | tuple):
        items = [wrong_answer(v, seed=seed + i) for i, v in enumerate(value)]
        return type(value)(items) if isinstance(value, list) or type(value) is tuple else type(value)(*items)
    if isinstance(value, Mapping):
        return {k: wrong_answer(v, seed=seed + i) for i, (k, v) in enumerate(value.items())}
    if callable(value):
        return _wrong_callable(value, seed)
    raise TypeError(f"cannot make a wrong answer of type {type(value).__name__}: answers must be tensors, arrays, "
                    "numbers, strings, booleans, containers of those, or callables")


def _wrong_callable(fn: Callable[..., Any], seed: int) -> Callable[..., Any]:
    def wrong(*args: Any, **kwargs: Any) -> Any:
        return wrong_answer(fn(*args, **kwargs), seed=seed)

    return wrong


def run_check(source: str, namespace: Mapping[str, Any], answers: Mapping[str, Any]) -> BaseException | None:
    """Execute a check cell's ``source`` in a copy of ``namespace`` with ``answers`` replaced; return what it raised.

    The copy is shallow: the check must only read the notebook's objects, never change them in place. What it
    prints is discarded.
    """
    scope = dict(namespace)
    scope.update(answers)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the learner-mode runs leave no output in the chapter
            exec(compile(source, "<exercise check>", "exec"), scope)
    except Exception as err:  # noqa: BLE001 - what the check raised is the result
        return err
    return None


def learner_mode(exercise: str, stage: str, source: str, names: list[str], namespace: Mapping[str, Any]) -> None:
    """Run one check of ``exercise`` as a learner would meet it; raise ``AssertionError`` if it behaves wrongly.

    ``stage="missing"`` (before the solution runs): every answer is ``None``; the check must raise
    :class:`ExerciseIncomplete`. ``stage="wrong"`` (after the solution): every answer is :func:`wrong_answer` of the
    solution's; the check must raise something other than ``NameError`` or :class:`ExerciseIncomplete`.
    """
    if stage == "missing":
        err = run_check(source, namespace, dict.fromkeys(names))
        if not isinstance(err, ExerciseIncomplete):
            got = "passed" if err is None else f"raised {type(err).__name__}: {err}"
            raise AssertionError(f"learner mode, exercise {exercise}: with no answer the check {got}; it must "
                                 "raise ExerciseIncomplete (call check_answers first, with every answer)")
        return
    if stage != "wrong":
        raise ValueError(f"stage must be 'missing' or 'wrong', got {stage!r}")
    missing = [n for n in names if n not in namespace]
    if missing:
        raise AssertionError(f"learner mode, exercise {exercise}: the solution did not define {missing}")
    err = run_check(source, namespace, {n: wrong_answer(namespace[n], seed=i) for i, n in enumerate(names)})
    if err is None or isinstance(err, NameError | ExerciseIncomplete):
        got = "passed" if err is None else f"raised {type(err).__name__}: {err}"
        raise AssertionError(f"learner mode, exercise {exercise}: with a wrong answer the check {got}; it must "
                             "fail: compare the answers with an independent reference")
