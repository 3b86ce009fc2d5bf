"""The book's helpers (every chapter): layer 8, above everything but tools; imports any layer below it.

- :func:`setup`: the first call of every chapter (defined here)
- :mod:`~bertlib.course.claims`: measured claims asserted with their margins
- :mod:`~bertlib.course.exercises`, :mod:`~bertlib.course.quiz`: exercise checks and quizzes
- :mod:`~bertlib.course.notebook`: bertviz views offline in a live notebook (its CDN list:
  :mod:`~bertlib.course.bertviz_assets`)
- :mod:`~bertlib.course.why_heads`, :mod:`~bertlib.course.why_normalise`: the experiments behind chapters 5 and 6
"""

from __future__ import annotations

from bertlib.course.notebook import node_modules_dir, use_vendored_bertviz_assets
from bertlib.model.runtime import Setup, configure


def setup(seed: int | None = None, verbose: bool = True) -> Setup:
    """A chapter's first call: :func:`bertlib.model.runtime.configure` (device, profile, seeds, threads, TF32 off,
    one printed line) and, in a live notebook, bertviz views that load their JavaScript from ``node_modules/``
    instead of CDNs (:func:`bertlib.course.notebook.use_vendored_bertviz_assets`), so they draw offline."""
    session = configure(seed, verbose)
    views = use_vendored_bertviz_assets()
    if verbose and views == "missing":
        print(f"bertviz views will load require.js, d3 and jQuery from CDNs: no copies in {node_modules_dir()} "
              "(run `npm ci` there, or `make lab`)")
    return session
