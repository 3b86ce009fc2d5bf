"""From token ids to predictions and their scores (chapter 9): a classifier's logits for many sequences in
length-sorted batches (:func:`predict_logits`, shared over DDP ranks), whole posts from their windows' logits
(:func:`predict_post_logits`; the windows and their pooling are :mod:`bertlib.data.windows`), accuracy
and F1 (:func:`scores`), both at once with the loss (:func:`evaluate`), and the one rule every choice of the book
follows: keep what scores best on the validation posts (:func:`best_on_validation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from bertlib.data.batches import collate, length_sorted_batches
from bertlib.data.windows import POOLINGS, pool_windows
from bertlib.model.runtime import autocast_for

T = TypeVar("T")


def autocast(device: torch.device, bf16: bool | None = None):
    """bfloat16 autocast (:func:`bertlib.model.runtime.autocast_for`: matmuls in bfloat16, reductions and the loss in
    float32) when ``bf16`` and the device multiplies bfloat16 natively; ``bf16=None``: on CUDA only."""
    return autocast_for(device, enabled=device.type == "cuda" if bf16 is None else bf16)


@dataclass(frozen=True)
class PredictOptions:
    """How :func:`predict_logits` runs the model over many sequences: ``batch_size`` sequences a batch
    (length-sorted), on ``device`` (``None``: the model's), as rank ``rank`` of ``world_size`` DDP processes, under
    bfloat16 autocast with ``bf16`` (``None``: on CUDA only, :func:`autocast`). Defined in chapter 9."""

    batch_size: int = 64
    device: torch.device | str | None = None
    rank: int = 0
    world_size: int = 1
    bf16: bool | None = None


@torch.no_grad()
def predict_logits(model: torch.nn.Module, seqs: list[list[int]], pad_id: int,
                   options: PredictOptions = PredictOptions(),
                   forward: Callable[..., torch.Tensor] | None = None) -> torch.Tensor:
    """``(n, num_labels)`` float32 logits on the CPU, in the order of ``seqs``; eval mode, length-sorted batches;
    under bfloat16 autocast with ``options.bf16`` (:class:`PredictOptions`). ``forward`` (default: ``model``
    itself) is what runs on each collated batch; chapter 9's probe passes ``model.pooled``, and the result is then
    ``(n, hidden)``.

    Under ``torch.distributed`` (``options.world_size > 1``, called by every rank) rank ``r`` runs batches ``r``,
    ``r + world_size``, ... and every rank returns all the logits (``all_gather_object``): each batch is exactly
    the one a single process runs, so the logits are the same."""
    o = options
    device = torch.device(o.device) if o.device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    forward = model if forward is None else forward
    batches = length_sorted_batches([len(s) for s in seqs], o.batch_size)
    mine = []
    for idx in batches[o.rank::o.world_size]:
        with autocast(device, o.bf16):
            mine.append((idx, forward(**collate([seqs[i] for i in idx], pad_id, device)).float().cpu()))
    model.train(was_training)
    parts: list = [mine]
    if o.world_size > 1:
        import torch.distributed as dist

        parts = [None] * o.world_size
        dist.all_gather_object(parts, mine)
    pieces = [piece for part in parts for piece in part]
    out = torch.empty(len(seqs), pieces[0][1].shape[-1] if pieces else model.num_labels)
    for idx, logits in pieces:
        out[torch.as_tensor(idx)] = logits
    return out


def predict_post_logits(model: torch.nn.Module, windows: list[list[int]], post_index, n_posts: int, pad_id: int,
                        how: str = "mean", options: PredictOptions = PredictOptions()) -> torch.Tensor:
    """``(n_posts, num_labels)`` float32 logits on the CPU: :func:`predict_logits` over all the
    windows (eval mode, length-sorted batches, under DDP shared over the ranks, bfloat16 autocast: the
    :class:`PredictOptions`), then :func:`bertlib.data.windows.pool_windows` by ``how``."""
    if how not in POOLINGS:  # before running the model
        raise ValueError(f"window pooling must be one of {sorted(POOLINGS)}, got {how!r}.")
    logits = predict_logits(model, windows, pad_id, options)
    return pool_windows(logits, torch.as_tensor(post_index), n_posts, how)


def scores(labels: np.ndarray, pred: np.ndarray, label_names: list[str]) -> dict:
    """Accuracy, macro-F1 and per-class F1 (name → F1)."""
    from sklearn.metrics import accuracy_score, f1_score

    per_class = f1_score(labels, pred, average=None, labels=range(len(label_names)), zero_division=0)
    return {"accuracy": float(accuracy_score(labels, pred)),
            "macro_f1": float(f1_score(labels, pred, average="macro", labels=range(len(label_names)),
                                       zero_division=0)),
            "per_class_f1": {name: float(f) for name, f in zip(label_names, per_class, strict=True)}}


def evaluate(model: torch.nn.Module, seqs: list[list[int]], labels: np.ndarray, label_names: list[str], pad_id: int,
             *, post_index: np.ndarray | None = None, window_pool: str = "mean",
             options: PredictOptions = PredictOptions()) -> tuple[dict, torch.Tensor]:
    """:func:`scores` of the model's predictions on ``seqs`` plus their mean cross-entropy (``"loss"``), and the
    ``(n, num_labels)`` logits (:func:`predict_logits` with the :class:`PredictOptions`: batch size, device, DDP
    rank, bfloat16; under DDP every rank calls it and gets everything).

    With ``post_index``, ``seqs`` are the windows of whole posts (:func:`bertlib.data.windows.encode_windows`) and each
    post's logits are its windows' pooled by ``window_pool`` (:func:`predict_post_logits`)."""
    if post_index is None:
        logits = predict_logits(model, seqs, pad_id, options)
    else:
        logits = predict_post_logits(model, seqs, post_index, len(labels), pad_id, window_pool, options)
    result = scores(labels, logits.argmax(-1).numpy(), label_names)
    result["loss"] = F.cross_entropy(logits, torch.as_tensor(labels, dtype=torch.long)).item()
    return result, logits


def best_on_validation(scored: Iterable[tuple[T, float]]) -> tuple[T, float]:
    """The first ``(candidate, validation score)`` pair with the highest score: the rule for every choice the book
    makes (an epoch's weights, TF-IDF features and ``C``, a probe's ``C``, a weight decay, an ensemble weight).
    ``scored`` may be a generator that fits each candidate as it is asked for, so only the best is kept; list the
    candidates in the order a tie should prefer (the simpler, the smaller ``C``, the even weight)."""
    best: tuple[T, float] | None = None
    for candidate, score in scored:
        if best is None or score > best[1]:
            best = (candidate, score)
    if best is None:
        raise ValueError("best_on_validation needs at least one candidate.")
    return best
