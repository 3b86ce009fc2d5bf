"""Claims about trained, sampled or timed quantities: asserted with a margin, and recorded for ``make sweep``.

An equality between our tensors and Hugging Face's is an ``assert_close`` with a stated tolerance. A claim such as
"the held-out loss fell" or "batched attention is faster" depends on the seed, the thread count and the CPU's
kernels, so it is asserted with :func:`assert_margin`, which also appends the observed value to the JSON-lines
file named by ``$BERTLIB_MARGINS`` (when set). ``python tests/sweep.py`` (``make sweep``) runs the chapters under
several seeds and one torch thread and reports, for every claim, the worst margin over the runs.
"""

from __future__ import annotations

import json
import os

import torch

from bertlib.model.runtime import default_seed, get_profile


def record(name: str, observed: float, bound: float, margin: float, relation: str, *, asserted: bool = False) -> None:
    """Append one observation to ``$BERTLIB_MARGINS`` (nothing happens when it is unset). ``asserted=False`` (a
    comparison the chapter reports without asserting it) is marked so in the sweep's table."""
    path = os.environ.get("BERTLIB_MARGINS")
    if not path:
        return
    row = dict(name=name, observed=observed, bound=bound, margin=margin, relation=relation, seed=default_seed(),
               threads=torch.get_num_threads(), profile=get_profile(), asserted=asserted)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def assert_margin(name: str, observed: float, bound: float, *, above: bool = True) -> float:
    """Assert ``observed > bound`` (``above=True``) or ``observed < bound``, and return the margin (positive).

    ``name`` identifies the claim in the sweep's table, e.g. ``"11: NSP accuracy above chance"``. The margin is
    ``observed - bound`` (or ``bound - observed``): how far the claim is from failing on this run.
    """
    observed, bound = float(observed), float(bound)
    margin = observed - bound if above else bound - observed
    relation = ">" if above else "<"
    record(name, observed, bound, margin, relation, asserted=True)
    assert margin > 0, f"{name}: observed {observed:.6g}, the claim needs {relation} {bound:.6g}"
    return margin
