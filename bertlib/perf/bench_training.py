"""The fine-tuning step made fast, timed against ``transformers.Trainer`` on the same batches (appendix 14, section
14.9, *Training fast*).

Chapter 9's trainer (:func:`bertlib.training.finetune.train_step`) already runs the fast kernels of the forward pass
(SDPA, one-kernel LayerNorm and GELU) and fused AdamW, the optimizer ``Trainer`` picks by default. This module times it
on the batches the ``cpu`` profile trains on with ``--train-windows``: every 128-token window of the 20 Newsgroups
training posts, shuffled, bucketed by length and batched (:func:`bertlib.data.batches.epoch_batches`). The rows,
interleaved round by round on the same batches (:func:`training_rows`):

- ``hf Trainer``: ``transformers.Trainer.train`` itself on ``BertForSequenceClassification`` (SDPA, its default
  fused AdamW), the batches fed in order; each step timed from the end of the one before (a callback), so data
  loading, the forward and backward passes, clipping, the optimizer and the schedule all count;
- ``bertlib, padded``: chapter 9's step on :class:`bertlib.tasks.classifier.BertClassifier` (SDPA, fused kernels, fused
AdamW);
- ``bertlib, padding-free``: the same with ``attn_implementation="unpadded"``: only the real tokens pass through
  the dense layers, forward and backward (:mod:`bertlib.model.encoder`);
- ``bertlib + torch.compile`` (``compile_=True``): the classifier's forward compiled by inductor; its backward is
  compiled too (AOTAutograd). Its compile time is reported apart.

Every row gives real tokens/s (padding not counted), the time per step and its speed-up over the Trainer, taken
within each round (median, min and max over rounds). The first step of each method in a round is not timed (the
Trainer builds its optimizer and data loader there).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from bertlib.data import newsgroups
from bertlib.data.batches import collate, epoch_batches
from bertlib.model.pretrained import Pretrained
from bertlib.model.runtime import autocast_for, bf16_supported, resolve_seed
from bertlib.perf.timing import sync
from bertlib.tasks.classifier import BertClassifier

__all__ = ["BF16", "COMPILED", "CurveSettings", "PADDED", "TRAINER", "TRAIN_COLUMNS", "UNPADDED", "bf16_step_error",
           "cpu_profile_batches", "cpu_profile_sequences", "padding_share", "padding_shares", "precisions_for",
           "time_to_accuracy", "training_rows"]

#: The columns :func:`bertlib.perf.timing.markdown` shows of :func:`training_rows`.
TRAIN_COLUMNS = ["method", "tokens_per_s", "ms_per_step", "speedup_vs_trainer", "speedup_min", "speedup_max",
                 "speedup_vs_ch9", "vs_ch9_min", "vs_ch9_max", "compile_s", "break_even_steps"]
LR, WEIGHT_DECAY, MAX_GRAD_NORM = 1e-4, 0.01, 1.0  # the cpu profile's encoder learning rate (finetune_config)


def cpu_profile_sequences(tokenizer, n_posts: int, max_length: int = 128, windows: bool = True,
                          stride: int = 0) -> tuple[list[list[int]], np.ndarray]:
    """Token ids and labels of the first ``n_posts`` training posts as the ``cpu`` profile reads them: with
    ``windows`` every window of ``max_length`` tokens, ``stride`` shared (``--train-windows``, the profile's
    ``window_stride`` 0; :func:`bertlib.data.windows.encode_windows`), each labelled with its post's class; else each
    post cut to ``max_length`` tokens, head + tail."""
    from bertlib.data.corpus import load_20newsgroups
    from bertlib.data.windows import encode_windows

    train = load_20newsgroups("train")
    texts, target = list(train.data[:n_posts]), np.asarray(train.target[:n_posts])
    if not windows:
        return newsgroups.encode(tokenizer, texts, max_length, "head_tail"), target
    seqs, post_index = encode_windows(tokenizer, texts, max_length, stride)
    return seqs, target[post_index]


def cpu_profile_batches(tokenizer, n_batches: int, batch_size: int, max_length: int = 128, seed: int | None = None,
                        bucket_batches: int = 50, windows: bool = True
                        ) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """The first ``n_batches`` training batches of a ``cpu``-profile epoch, as ``(batch, labels)`` pairs: the
    sequences of :func:`cpu_profile_sequences` of enough posts for at least one bucket of ``bucket_batches``
    batches (so the length sorting is the profile's), batched by :func:`bertlib.data.batches.epoch_batches`. ``batch``
    holds ``(batch, seq)`` tensors; ``labels`` is ``(batch,)``."""
    n_posts = max(bucket_batches, n_batches) * batch_size
    seqs, labels = cpu_profile_sequences(tokenizer, n_posts, max_length, windows)
    order = epoch_batches(np.array([len(s) for s in seqs]), batch_size, resolve_seed(seed), 0, bucket_batches)
    order = [idx for idx in order if len(idx) == batch_size]
    if len(order) < n_batches:
        raise ValueError(f"asked for {n_batches} batches of {batch_size}; the training split gives {len(order)}.")
    return [(collate([seqs[i] for i in idx], tokenizer.pad_token_id, "cpu"),
             torch.as_tensor(labels[idx], dtype=torch.long)) for idx in order[:n_batches]]


def padding_share(batches) -> float:
    """The share of the batches' positions that are padding."""
    masks = [b["attention_mask"] for b, _ in batches]
    return 1.0 - sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)


def padding_shares(lengths, batch_size: int, seed: int | None = None, bucket_batches: int = 50) -> dict[str, float]:
    """The padding share of sequences of these ``lengths`` batched as a trainer without buckets batches them
    (shuffled, cut into batches) and as chapter 9's trainer does (:func:`bertlib.data.batches.epoch_batches`):
    ``{"shuffled": ..., "bucketed": ...}``."""
    lengths = np.asarray(lengths)

    def share(batches) -> float:
        return 1.0 - lengths.sum() / sum(len(b) * lengths[b].max() for b in batches)
    seed = resolve_seed(seed)  # default: $BERTLIB_SEED, else 0
    order = np.random.default_rng([seed, 0]).permutation(len(lengths))
    shuffled = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    return {"shuffled": float(share(shuffled)),
            "bucketed": float(share(epoch_batches(lengths, batch_size, seed, 0, bucket_batches)))}


def _bertlib_runner(pt: Pretrained, num_labels: int, attn: str, compile_: bool = False, bf16: bool = False,
                    lr: float = LR) -> Callable:
    """A function that trains chapter 9's classifier on a list of batches, one step each (with ``bf16``: bfloat16
    autocast, :func:`bertlib.model.runtime.autocast_for`), and returns the ``time.perf_counter()`` at the end of
    every step;
    the model it trains is its ``.model``, its AdamW ``.optimizer``."""
    from bertlib.training.finetune import train_step
    from bertlib.training.optimization import adamw

    model = BertClassifier(pt.state_dict, pt.config, num_labels, attn_implementation=attn, fused=True).train()
    opt = adamw(model, lr, WEIGHT_DECAY)
    net = torch.compile(model) if compile_ else model

    def run(batches) -> list[float]:
        ends = []
        for batch, labels in batches:
            # bf16=None: chapter 9's default (bf16 autocast on CUDA only)
            train_step(net, batch, labels, opt, max_grad_norm=MAX_GRAD_NORM, bf16=bf16 or None)
            ends.append(_now(labels.device))
        return ends
    run.model, run.optimizer = model, opt
    return run


def _trainer_runner(pt: Pretrained, num_labels: int, device: torch.device, callbacks: tuple = (),
                    bf16: bool = False, lr: float = LR) -> Callable:
    """The same as :func:`_bertlib_runner` through ``transformers.Trainer.train`` on ``BertForSequenceClassification``
    (SDPA, the same initial weights): a new ``Trainer`` per call, the batches fed in order, one per step, with
    ``callbacks`` (``TrainerCallback`` instances) beside the clock. ``bf16``: ``TrainingArguments(bf16=True)``,
    accelerate's bfloat16 autocast, on a CPU that supports it (always on CUDA, as :func:`train_step`)."""
    from torch.utils.data import SequentialSampler
    from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

    from bertlib.tasks.export import to_hf_classifier

    # the classifier as BertClassifier initialises it (seed 0), in HF's class (strict load): both rows train one model
    model = to_hf_classifier(BertClassifier(pt.state_dict, pt.config, num_labels), [str(i) for i in range(num_labels)])
    model.set_attn_implementation("sdpa")
    model.to(device)

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(_now(device))

    class InOrder(Trainer):  # the batches in the order given, as the bertlib rows take them
        def _get_train_sampler(self, train_dataset=None):
            return SequentialSampler(train_dataset if train_dataset is not None else self.train_dataset)

    def run(batches) -> list[float]:
        items = [{**b, "labels": y} for b, y in batches]
        clock = Clock()
        with _random_states_kept(), tempfile.TemporaryDirectory() as outdir:  # Trainer seeds every generator
            args = TrainingArguments(  # as train_step: bf16 autocast (CUDA or asked), clipping, fused AdamW
                output_dir=outdir, per_device_train_batch_size=1, max_steps=len(items), learning_rate=lr,
                weight_decay=WEIGHT_DECAY, max_grad_norm=MAX_GRAD_NORM, lr_scheduler_type="constant",
                optim="adamw_torch_fused", logging_strategy="no", save_strategy="no", report_to="none",
                disable_tqdm=True, dataloader_pin_memory=False, use_cpu=device.type == "cpu",
                bf16=device.type == "cuda" or (bf16 and bf16_supported(device)), seed=0)
            trainer = InOrder(model=model, args=args, train_dataset=items, data_collator=lambda one: one[0],
                              callbacks=[clock, *callbacks])
            trainer.remove_callback(PrinterCallback)  # it prints the run's summary; the rows report it
            trainer.train()
        return clock.ends
    run.model = model
    return run


#: The posts the time-to-accuracy curves draw from (``--curves``, appendix 14.9): the quick profile's draw before
#: 2026-11-28 (300 training posts), and 200 test posts, on which the committed curves were measured.
CURVE_POSTS = dict(**newsgroups.QUICK_BEFORE, test_size=200)

TRAINER = "hf Trainer (sdpa, adamw_torch_fused)"
PADDED = "bertlib, padded (sdpa, fused)"
UNPADDED = "bertlib, padding-free"
COMPILED = "bertlib + torch.compile (sdpa, fused)"
BF16 = " + bf16"  # appended to a method's name: the same step under bfloat16 autocast


def precisions_for(device: torch.device) -> tuple[str, ...]:
    """``("float32", "bfloat16")`` on a CPU where :func:`bertlib.model.runtime.bf16_supported`, else ``("float32",)``.
    On CUDA chapter 9's step and ``Trainer`` always run under bf16 autocast, so there is one set of rows."""
    return ("float32", "bfloat16") if device.type == "cpu" and bf16_supported(device) else ("float32",)


def _runners(pt: Pretrained, num_labels: int, device: torch.device, precisions, compile_: bool) -> dict:
    """Every method of :func:`training_rows` at every precision, by row name."""
    runners = {}
    for precision in precisions:
        bf16, tag = precision == "bfloat16", BF16 if precision == "bfloat16" else ""
        runners[TRAINER + tag] = _trainer_runner(pt, num_labels, device, bf16=bf16)
        runners[PADDED + tag] = _bertlib_runner(pt, num_labels, "sdpa", bf16=bf16)
        runners[UNPADDED + tag] = _bertlib_runner(pt, num_labels, "unpadded", bf16=bf16)
        if compile_:
            runners[COMPILED + tag] = _bertlib_runner(pt, num_labels, "sdpa", compile_=True, bf16=bf16)
    return runners


def _paired(numerator: list[float], denominator: list[float]) -> tuple[float, float, float]:
    """Median, min and max over rounds of ``numerator[r] / denominator[r]`` (seconds: a speed-up)."""
    ratio = [a / b for a, b in zip(numerator, denominator, strict=True)]
    return round(statistics.median(ratio), 3), round(min(ratio), 3), round(max(ratio), 3)


def training_rows(pt: Pretrained, device: torch.device, batches, rounds: int, steps: int, num_labels: int = 20,
                  compile_: bool = False, precisions: tuple[str, ...] | None = None) -> dict:
    """Tokens/s of one fine-tuning step by each method on ``batches`` (:func:`cpu_profile_batches`): ``rounds``
    rounds, each taking the next ``steps`` batches through every method in turn (the first step of each untimed).

    Methods: ``Trainer``, chapter 9's padded step, the padding-free step and (``compile_``) the compiled padded step,
    each at every precision of ``precisions`` (default :func:`precisions_for`: bfloat16 autocast only where the
    device supports it; the master weights and AdamW's state stay float32). Returns ``{"rows": [...],
    "setup": {...}, "seconds": {method: [timed seconds per round]}}``. Speed-ups are paired within a round (median,
    min, max over rounds): ``speedup_vs_trainer`` over ``Trainer`` at the same precision, ``speedup_vs_ch9`` over
    chapter 9's padded float32 step (so each change alone and all of them together). A compiled row gives
    ``compile_s`` and ``break_even_steps``: the steps its saving per step takes to repay the compile time (None:
    it never does, the compiled step was not faster). The setup's ``padding_share`` and ``tokens`` are the timed
    batches'."""
    if len(batches) < rounds * steps or steps < 2:
        raise ValueError(f"need steps >= 2 and rounds * steps = {rounds * steps} batches, got {len(batches)}.")
    precisions = tuple(precisions or precisions_for(device))
    if "float32" not in precisions or not set(precisions) <= {"float32", "bfloat16"}:
        raise ValueError(f"precisions must hold 'float32' (the rows' reference) and may add 'bfloat16', "
                         f"got {precisions!r}.")
    if "bfloat16" in precisions and not bf16_supported(device):
        print(f"bench_training: {device} has no native bfloat16 matrix products: the float32 rows only")
        precisions = tuple(p for p in precisions if p != "bfloat16")
    runners = _runners(pt, num_labels, device, precisions, compile_)
    compile_s = _compile_times(runners, batches, device)
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    timed = []
    names = list(runners)
    for r in range(rounds):
        chunk = [(_to(b, device), y.to(device)) for b, y in batches[r * steps:(r + 1) * steps]]
        timed += chunk[1:]
        for name in names[r % len(names):] + names[:r % len(names)]:  # each round starts with another method
            ends = runners[name](chunk)
            seconds[name].append(ends[-1] - ends[0])
    tokens = sum(int(b["attention_mask"].sum()) for b, _ in timed)
    rows = [_training_row(name, seconds, steps - 1, tokens, compile_s) for name in seconds]
    setup_info = {"batch_size": int(batches[0][0]["input_ids"].shape[0]), "rounds": rounds, "steps": steps,
                  "padding_share": round(padding_share(timed), 4), "tokens": tokens, "precisions": list(precisions),
                  "bf16_supported": bf16_supported(device), "threads": torch.get_num_threads(), "model": pt.source}
    return {"rows": rows, "setup": setup_info, "seconds": seconds}


def _compile_times(runners: dict, batches, device: torch.device) -> dict[str, float]:
    """Compile each compiled runner on two batches of different lengths, so inductor marks the length dynamic before
    the timing; its compile seconds by row name."""
    compile_s = {}
    for name in [n for n in runners if n.startswith(COMPILED)]:
        widths = {b["input_ids"].shape[1]: (b, y) for b, y in batches}
        warm = [(_to(b, device), y.to(device)) for b, y in list(widths.values())[:2]]
        t0 = time.perf_counter()
        runners[name](warm)
        compile_s[name] = round(time.perf_counter() - t0, 1)
    return compile_s


def _training_row(name: str, seconds: dict[str, list[float]], timed_steps: int, tokens: int,
                  compile_s: dict[str, float]) -> dict:
    """One row of :func:`training_rows` from every method's timed ``seconds`` per round (``timed_steps`` steps each,
    ``tokens`` real tokens in all): speed, and speed-ups paired within a round over ``Trainer`` at the same
    precision and over chapter 9's padded float32 step; a compiled row's break-even step count."""
    secs = seconds[name]
    precision = "bfloat16" if name.endswith(BF16) else "float32"
    vs_trainer = _paired(seconds[TRAINER + (BF16 if precision == "bfloat16" else "")], secs)
    vs_ch9 = _paired(seconds[PADDED], secs)
    ms = 1e3 * statistics.median(secs) / timed_steps
    row = {"method": name, "precision": precision, "tokens_per_s": round(tokens / sum(secs), 1),
           "ms_per_step": round(ms, 1), "speedup_vs_trainer": vs_trainer[0], "speedup_min": vs_trainer[1],
           "speedup_max": vs_trainer[2], "speedup_vs_ch9": vs_ch9[0], "vs_ch9_min": vs_ch9[1],
           "vs_ch9_max": vs_ch9[2], "compile_s": compile_s.get(name), "break_even_steps": None}
    if name in compile_s:
        eager = 1e3 * statistics.median(seconds[name.replace(COMPILED, PADDED)]) / timed_steps
        saved_s = (eager - ms) / 1e3
        row["break_even_steps"] = round(compile_s[name] / saved_s) if saved_s > 0 else None
    return row


def bf16_step_error(pt: Pretrained, batches, num_labels: int = 20, attn: str = "unpadded") -> dict:
    """How far the bfloat16-autocast step's loss and gradient are from float32's: chapter 9's classifier
    (``attn``, dropout off, the same weights) on each of ``batches``, loss and gradient (all parameters as one
    vector, before clipping) under :func:`bertlib.model.runtime.autocast_for` and without it. Returns the largest
    relative
    errors over the batches, ``loss_rel`` = |l16 - l32| / |l32| and ``grad_rel`` = ‖g16 - g32‖ / ‖g32‖, with
    ``grad_cos`` their smallest cosine similarity, and the per-batch values (``per_batch``); the same as
    float32 where bf16 is not supported (all zeros: nothing to compare)."""
    config = pt.config.__class__.from_dict({**pt.config.to_dict(), "hidden_dropout_prob": 0.0,
                                            "attention_probs_dropout_prob": 0.0})
    model = BertClassifier(pt.state_dict, config, num_labels, attn_implementation=attn, fused=True).train()
    device = next(model.parameters()).device

    def loss_and_grad(batch, labels, bf16):
        model.zero_grad(set_to_none=True)
        with autocast_for(device, bf16):
            loss = torch.nn.functional.cross_entropy(model(**batch).float(), labels)
        loss.backward()
        return loss.detach(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    per_batch = []
    for batch, labels in batches:
        batch, labels = _to(batch, device), labels.to(device)
        (l32, g32), (l16, g16) = (loss_and_grad(batch, labels, bf16) for bf16 in (False, True))
        per_batch.append({"loss_rel": float((l16 - l32).abs() / l32.abs()),
                          "grad_rel": float((g16 - g32).norm() / g32.norm()),
                          "grad_cos": float(torch.nn.functional.cosine_similarity(g16.double(), g32.double(), dim=0))})
    return {"loss_rel": max(b["loss_rel"] for b in per_batch), "grad_rel": max(b["grad_rel"] for b in per_batch),
            "grad_cos": min(b["grad_cos"] for b in per_batch), "per_batch": per_batch,
            "bf16": bf16_supported(device)}


@dataclass(frozen=True)
class CurveSettings:
    """How :func:`time_to_accuracy` trains: ``epochs`` over the training posts in batches of ``batch_size`` (bucketed
    by length over ``bucket_batches`` batches, shuffled by ``seed``), at the constant learning rate ``lr``, scored on
    validation every ``eval_every`` steps; a new head of ``num_labels`` classes (initialised from ``seed`` too)."""

    epochs: int
    batch_size: int
    eval_every: int
    lr: float = LR
    num_labels: int = 20
    seed: int = 0
    bucket_batches: int = 50


def time_to_accuracy(pt: Pretrained, device: torch.device, train: tuple[list[list[int]], np.ndarray],
                     val: tuple[list[list[int]], np.ndarray], method: str, settings: CurveSettings) -> dict:
    """Validation accuracy against training wall-clock seconds, for one short real fine-tuning run.

    ``method`` is a row name of :func:`training_rows` (``UNPADDED + BF16``, ``TRAINER``, ...; compiled rows are
    not offered here). ``train`` and ``val`` are token ids and class indices. Every method trains the same initial
    model on the same batches (:func:`bertlib.data.batches.epoch_batches`, ``settings.epochs`` epochs, constant
    learning rate ``settings.lr``, fused AdamW, clipping); every ``settings.eval_every`` steps, and at the end, the
    model is scored on ``val`` (float32, eval mode, dropout off) with the clock stopped. Returns ``{"method",
    "seconds": [...], "steps": [...], "accuracy": [...]}``, starting at step 0 (the untrained head), and
    ``"tokens"`` trained on."""
    bf16, c = method.endswith(BF16), settings
    base = method.removesuffix(BF16)
    if base not in (TRAINER, PADDED, UNPADDED):
        raise ValueError(f"time_to_accuracy: method must be one of {[TRAINER, PADDED, UNPADDED]} (+ {BF16!r}), "
                         f"got {method!r}.")
    seqs, labels = train
    lengths = np.array([len(s) for s in seqs])
    pad = pt.tokenizer.pad_token_id
    batches = [(collate([seqs[i] for i in idx], pad, device), torch.as_tensor(labels[idx], device=device))
               for epoch in range(c.epochs) for idx in epoch_batches(lengths, c.batch_size, c.seed, epoch,
                                                                     c.bucket_batches)]
    val_batches = [(collate([val[0][i] for i in idx], pad, device), torch.as_tensor(val[1][idx]))
                   for idx in np.array_split(np.argsort([len(s) for s in val[0]]), max(1, len(val[0]) // 64))]

    @torch.no_grad()
    def accuracy(model) -> float:
        was = model.training
        model.eval()
        right = 0
        for batch, y in val_batches:
            out = model(**batch)
            right += int((getattr(out, "logits", out).argmax(-1).cpu() == y).sum())
        model.train(was)
        return right / len(val[1])

    curve = {"method": method, "seconds": [], "steps": [], "accuracy": [],
             "tokens": sum(int(b["attention_mask"].sum()) for b, _ in batches)}

    def point(model, step: int, seconds: float) -> None:
        curve["seconds"].append(round(seconds, 3))
        curve["steps"].append(step)
        curve["accuracy"].append(accuracy(model))
    with _random_states_kept():
        torch.manual_seed(c.seed)  # dropout: the same masks for every bertlib method
        if base == TRAINER:
            _trainer_curve(pt, c, device, batches, bf16, point)
        else:
            run = _bertlib_runner(pt, c.num_labels, "unpadded" if base == UNPADDED else "sdpa", bf16=bf16, lr=c.lr)
            point(run.model, 0, 0.0)
            elapsed, start = 0.0, _now(device)
            for step, one in enumerate(batches, 1):
                elapsed += run([one])[-1] - start
                if step % c.eval_every == 0 or step == len(batches):
                    point(run.model, step, elapsed)
                start = _now(device)
    return curve


def _trainer_curve(pt: Pretrained, settings: CurveSettings, device: torch.device, batches, bf16: bool,
                   point: Callable) -> None:
    """:func:`time_to_accuracy` for ``Trainer``: ``point(model, step, seconds)`` from a callback, the time spent
    in it taken off the clock; the clock starts when ``Trainer.train`` begins."""
    from transformers import TrainerCallback

    class Scores(TrainerCallback):
        start, paused = None, 0.0

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.start = _now(device)
            point(model, 0, 0.0)
            self.paused = _now(device) - self.start

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % settings.eval_every == 0 or state.global_step == len(batches):
                t = _now(device)
                point(model, state.global_step, t - self.start - self.paused)
                self.paused += _now(device) - t

    run = _trainer_runner(pt, settings.num_labels, device, callbacks=(Scores(),), bf16=bf16, lr=settings.lr)
    run(batches)


@contextlib.contextmanager
def _random_states_kept():
    """Python's, NumPy's and torch's random states restored on exit."""
    py, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        yield
    random.setstate(py)
    np.random.set_state(np_state)


def _now(device: torch.device) -> float:
    """``time.perf_counter()`` once ``device`` has finished its queued work (CUDA runs asynchronously)."""
    sync(device)
    return time.perf_counter()


def _to(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in batch.items()}


def main(argv: list[str] | None = None) -> dict:
    """``python -m bertlib.perf.bench_training``: the training section of ``python -m bertlib.perf.bench`` alone (its
    rows,
    the bf16 step's error and, with ``--curves N``, time-to-accuracy curves on ``N`` of the quick profile's training
    posts), written as JSON with the machine's load."""
    import argparse
    import json
    import os

    from bertlib.model.pretrained import load_pretrained
    from bertlib.model.runtime import configure
    from bertlib.perf.timing import markdown
    from bertlib.training.finetune_config import profile_config

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32, help="windows per batch (default 32, the cpu profile's)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--steps", type=int, default=4, help="steps per method per round, the first untimed")
    parser.add_argument("--no-compile", action="store_true", help="leave out the torch.compile rows")
    parser.add_argument("--curves", type=int, default=0, help="time-to-accuracy curves on this many posts (0: none)")
    parser.add_argument("--out", default=None, help="write the result as JSON")
    args = parser.parse_args(argv)
    device = configure().device
    pt = load_pretrained(device=device)
    batches = cpu_profile_batches(pt.tokenizer, args.rounds * args.steps, args.batch, min(128, pt.max_length))
    result = training_rows(pt, device, batches, args.rounds, args.steps, compile_=not args.no_compile)
    result["bf16_error"] = bf16_step_error(pt, batches[:args.rounds])
    print(markdown(result["rows"], TRAIN_COLUMNS))
    print({k: v for k, v in result["bf16_error"].items() if k != "per_batch"})
    if args.curves:
        data = newsgroups.load_data(profile_config("quick", **CURVE_POSTS))
        train = (newsgroups.encode(pt.tokenizer, list(data.train.texts[:args.curves]), 128, "head_tail"),
                 data.train.labels)
        val = newsgroups.encode(pt.tokenizer, list(data.test.texts[:100]), 128, "head_tail"), data.test.labels[:100]
        tag = BF16 if bf16_supported(device) else ""
        settings = CurveSettings(epochs=3, batch_size=16, eval_every=10, lr=2e-4)
        result["curves"] = [time_to_accuracy(pt, device, (train[0], train[1][:args.curves]), val, method, settings)
                            for method in (UNPADDED + tag, TRAINER + tag, PADDED)]
        for c in result["curves"]:
            print(c["method"], list(zip(c["seconds"], c["accuracy"], strict=True)))
    result["setup"]["load_average"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"bench_training: wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
