"""Exercise checks that a learner can run before writing an answer (every chapter's *Exercises* section).

An exercise in a chapter is four cells: a visible *starter* cell that sets every answer to ``None``, a hidden
*solution* cell, a visible *check* cell that starts with :func:`check_answers`, and the explanation. A learner
writes code in the starter cell and runs the check; an answer still ``None`` gives a friendly
:class:`ExerciseIncomplete` instead of a ``NameError`` from deep inside the check.

:func:`wrong_answer` and :func:`run_check` serve ``tests/nbval_learner.py``, which runs every check in *learner mode*
while nbval executes the chapter: without the solution the check must fail with :class:`ExerciseIncomplete`, with
a deliberately wrong answer it must fail too, and so it must with any value the page already holds in place of an
answer (:func:`lazy_pass`: a learner must not be able to copy the answer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import math
import warnings
from collections.abc import Callable, Mapping
from functools import partial
from types import FunctionType, ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import torch

from bertlib.model.runtime import resolve_seed


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


_exact_predictions = False  # set by lazy_pass: a prediction passes only if it is the measured value itself


def check_prediction(exercise: str, guess: float, measured: float, *, within: float | None = None,
                     factor: float | None = None) -> None:
    """Compare a learner's prediction with the value the check ``measured``: a *predict-then-check* exercise.

    The guess passes within ``within`` of ``measured`` (shares, cosines) or within a ``factor`` of it (sizes,
    ratios; both must be positive). A wrong guess raises ``AssertionError`` saying "too high" or "too low",
    never the measured value. During learner mode's lazy pass it passes only when it equals ``measured`` (to
    1e-9): a number of the page that falls in the band by chance is not the answer, the measured value itself
    would be.
    """
    if (within is None) == (factor is None):
        raise ValueError("give exactly one of within= (an absolute band) or factor= (a ratio band)")
    if isinstance(guess, bool) or not isinstance(guess, int | float | np.integer | np.floating):
        raise AssertionError(f"Exercise {exercise}: a prediction is a number, got {type(guess).__name__}")
    guess, measured = float(guess), float(measured)
    if not math.isfinite(guess):
        raise AssertionError(f"Exercise {exercise}: a prediction is a finite number, got {guess}")
    if _exact_predictions:
        slack = 1e-9 * max(1.0, abs(measured))
        low, high = measured - slack, measured + slack
    elif within is not None:
        low, high = measured - within, measured + within
    else:
        if guess <= 0 or measured <= 0:
            raise AssertionError(f"Exercise {exercise}: this prediction is a positive number")
        low, high = measured / factor, measured * factor
    band = f"within {within:.3g} of the measured value" if within is not None else f"within a factor of {factor:.3g}"
    if guess > high:
        raise AssertionError(f"Exercise {exercise}: your prediction is too high (it must be {band})")
    if guess < low:
        raise AssertionError(f"Exercise {exercise}: your prediction is too low (it must be {band})")
    print(f"Exercise {exercise}: your prediction is {band}.")


def wrong_answer(value: Any, *, seed: int | None = None) -> Any:
    """A deliberately wrong version of an answer, of the same type and shape, for testing that a check can fail.

    Tensors and arrays: floats get ``+ 1`` plus seeded noise (so ratios, argmaxes and sums all move), integers
    ``+ 1``, booleans are flipped; Python numbers, strings and booleans change likewise; containers element-wise;
    a callable returns wrong outputs. Anything else raises ``TypeError``: keep answers to these types. ``seed``
    (default ``$BERTLIB_SEED``, else 0) draws the noise.
    """
    seed = resolve_seed(seed)
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
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():  # the learner-mode runs leave
            warnings.simplefilter("ignore")  # no output in the chapter: no prints, no warnings on stderr
            exec(compile(source, "<exercise check>", "exec"), scope)
    except Exception as err:  # noqa: BLE001 - what the check raised is the result
        return err
    return None


# Names a kernel defines that are not the chapter's: IPython's history and helpers.
_NOT_ON_PAGE = frozenset({"In", "Out", "exit", "quit", "get_ipython", "open"})
_MAX_ITEMS = 256  # items of one list, tuple or dict looked into for candidates
_MAX_CANDIDATES = 48  # candidates tried per answer, the nearest to the solution's answer first
_before_solution: dict[str, dict[str, Any]] = {}  # exercise id -> the namespace as the solution cell found it


def _page_values(namespace: Mapping[str, Any], exclude: set[str]):
    """``(label, value)`` for every visible variable and the items of its containers (two levels deep).

    Items: of lists and tuples, dicts (a ``transformers`` ``ModelOutput`` is one), dataclasses and simple
    namespaces, so that ``ref.hidden_states[3]`` is found as well as ``ref``.
    """
    def items(label: str, value: Any):
        if isinstance(value, list | tuple) and not isinstance(value, str):
            return ((f"{label}[{i}]", v) for i, v in enumerate(value[:_MAX_ITEMS]))
        if isinstance(value, Mapping):
            return ((f"{label}[{k!r}]", v) for k, v in list(value.items())[:_MAX_ITEMS])
        if dataclasses.is_dataclass(value) and not isinstance(value, type) or isinstance(value, SimpleNamespace):
            return ((f"{label}.{k}", v) for k, v in list(vars(value).items())[:_MAX_ITEMS])
        return ()

    for name, value in namespace.items():
        if name.startswith("_") or name in _NOT_ON_PAGE or name in exclude or isinstance(value, ModuleType):
            continue
        yield name, value
        for label, item in items(name, value):
            yield label, item
            yield from items(label, item)


def _number(value: Any) -> float | None:
    """``value`` as a float when it is a real number other than a bool (Python or NumPy), else ``None``."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        return None
    return float(value)


def _distance(candidate: Any, answer: Any) -> float | None:
    """How far ``candidate`` is from ``answer`` if it is of the same kind and shape (``None`` when it is not).

    Tensors and arrays: same shape and dtype, distance the largest absolute difference. Numbers: integers for an
    integer answer, floats for a float one. Strings, lists, tuples and dicts: same type (and length or keys).
    Functions that take as many positional arguments, for a function answer. Booleans are never candidates: a
    yes/no answer is always on the page.
    """
    if isinstance(answer, torch.Tensor | np.ndarray):
        if type(candidate) is not type(answer) or candidate.shape != answer.shape or candidate.dtype != answer.dtype:
            return None
        a, c = (torch.as_tensor(x) if isinstance(x, np.ndarray) else x.detach() for x in (answer, candidate))
        if a.numel() == 0:
            return 0.0
        if a.dtype == torch.bool or not (a.is_floating_point() or a.is_complex()):
            return float((a != c.to(a.device)).sum())
        return float((a - c.to(a.device)).abs().nan_to_num(float("inf")).max())
    if _number(answer) is not None:
        integral = isinstance(answer, int | np.integer)
        if _number(candidate) is None or isinstance(candidate, int | np.integer) != integral:
            return None
        return abs(_number(candidate) - _number(answer))
    if isinstance(answer, bool | np.bool_):
        return None
    if isinstance(answer, str | list | tuple):
        if type(candidate) is not type(answer) or len(candidate) != len(answer):
            return None
        return float(candidate != answer) if isinstance(answer, str) else 1.0
    if isinstance(answer, Mapping):
        ok = isinstance(candidate, Mapping) and candidate.keys() == answer.keys()
        return 1.0 if ok else None
    if isinstance(answer, FunctionType | partial):
        same = isinstance(candidate, FunctionType | partial) and _arity(candidate) == _arity(answer)
        return 1.0 if same else None
    return None


def _arity(fn: Callable[..., Any]) -> int | None:
    """How many positional parameters ``fn`` requires (``None`` when its signature cannot be read)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    return sum(p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def lazy_candidates(answer: Any, namespace: Mapping[str, Any], exclude: set[str]) -> list[tuple[str, Any]]:
    """The values on the page a learner could paste in place of ``answer``: same kind and shape, nearest first.

    Values that are the same object or equal in value count once; at most ``_MAX_CANDIDATES`` of them.
    """
    seen: dict[int, None] = {}
    found: list[tuple[float, int, str, Any]] = []
    for order, (label, value) in enumerate(_page_values(namespace, exclude)):
        if id(value) in seen:
            continue
        seen[id(value)] = None
        d = _distance(value, answer)
        if d is not None:
            found.append((d, order, label, value))
    found.sort(key=lambda t: (t[0], t[1]))
    kept: list[tuple[str, Any]] = []
    for _, _, label, value in found:
        if len(kept) == _MAX_CANDIDATES:
            break
        if not any(_same(value, other) for _, other in kept):
            kept.append((label, value))
    return kept


def _same(a: Any, b: Any) -> bool:
    try:
        if isinstance(a, torch.Tensor):
            return a.device == b.device and bool(torch.equal(a, b))
        if isinstance(a, np.ndarray):
            return bool(np.array_equal(a, b))
        return bool(a == b) if isinstance(a, int | float | str | np.number) else a is b
    except (TypeError, RuntimeError, ValueError):
        return False


def learner_mode(exercise: str, stage: str, source: str, names: list[str], namespace: Mapping[str, Any]) -> None:
    """Run one check of ``exercise`` as a learner would meet it; raise ``AssertionError`` if it behaves wrongly.

    ``stage="missing"`` (before the solution runs): every answer is ``None``; the check must raise
    :class:`ExerciseIncomplete`. ``stage="wrong"`` (after the solution): every answer is :func:`wrong_answer` of the
    solution's; the check must raise something other than ``NameError`` or :class:`ExerciseIncomplete`. Then the
    *lazy pass*: each answer in turn is replaced by every value the page already holds of its kind and shape
    (:func:`lazy_candidates`: visible variables and the items of their containers, not the answers and not what the
    solution cell defined); the check must fail for each. An answer the page already holds is not an exercise.
    """
    if stage == "missing":
        _before_solution[exercise] = dict(namespace)
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
    lazy_pass(exercise, source, names, namespace)


def lazy_pass(exercise: str, source: str, names: list[str], namespace: Mapping[str, Any]) -> None:
    """Require the check of ``exercise`` to fail with each answer replaced by a value the page already holds.

    The solution cell's names are those bound or rebound since the ``"missing"`` stage ran (all of them when it did
    not run): a learner does not have them. A prediction (:func:`check_prediction`) counts as found only when the
    page holds the measured value itself, not a number that falls in its tolerance band by chance.
    """
    global _exact_predictions
    before = _before_solution.pop(exercise, {})
    solution = {n for n, v in namespace.items() if n not in before or before[n] is not v}
    exclude = set(names) | solution
    accepted = []
    _exact_predictions = True
    try:
        for name in names:
            for label, value in lazy_candidates(namespace[name], namespace, exclude):
                if run_check(source, namespace, {name: value}) is None:
                    accepted.append(f"`{name}` = `{label}`")
    finally:
        _exact_predictions = False
    if accepted:
        raise AssertionError(
            f"learner mode, exercise {exercise}: the check passes with an answer the page already holds "
            f"({', '.join(accepted)}); change the task or the check so that copying a variable fails, or rename the "
            "variable if it means something else")
