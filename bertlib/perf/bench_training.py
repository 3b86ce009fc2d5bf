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

import numpy as np
import torch

from bertlib.data.batches import collate, epoch_batches
from bertlib.model.pretrained import Pretrained
from bertlib.perf.timing import sync
from bertlib.tasks.classifier import BertClassifier

__all__ = ["TRAIN_COLUMNS", "cpu_profile_batches", "cpu_profile_sequences", "padding_share", "padding_shares",
           "training_rows"]

#: The columns :func:`bertlib.perf.bench.markdown` shows of :func:`training_rows`.
TRAIN_COLUMNS = ["method", "tokens_per_s", "ms_per_step", "speedup_vs_trainer", "speedup_min", "speedup_max",
                 "compile_s"]
LR, WEIGHT_DECAY, MAX_GRAD_NORM = 1e-4, 0.01, 1.0  # the cpu profile's encoder learning rate (finetune_config)


def cpu_profile_sequences(tokenizer, n_posts: int, max_length: int = 128, windows: bool = True,
                          stride: int = 0) -> tuple[list[list[int]], np.ndarray]:
    """Token ids and labels of the first ``n_posts`` training posts as the ``cpu`` profile reads them: with
    ``windows`` every window of ``max_length`` tokens, ``stride`` shared (``--train-windows``, the profile's
    ``window_stride`` 0; :func:`bertlib.data.windows.encode_windows`), each labelled with its post's class; else each
    post cut to ``max_length`` tokens, head + tail."""
    from bertlib.data.corpus import load_20newsgroups
    from bertlib.data.newsgroups import encode
    from bertlib.data.windows import encode_windows

    train = load_20newsgroups("train")
    texts, target = list(train.data[:n_posts]), np.asarray(train.target[:n_posts])
    if not windows:
        return encode(tokenizer, texts, max_length, "head_tail"), target
    seqs, post_index = encode_windows(tokenizer, texts, max_length, stride)
    return seqs, target[post_index]


def cpu_profile_batches(tokenizer, n_batches: int, batch_size: int, max_length: int = 128, seed: int = 0,
                        bucket_batches: int = 50, windows: bool = True
                        ) -> list[tuple[dict[str, torch.Tensor], torch.Tensor]]:
    """The first ``n_batches`` training batches of a ``cpu``-profile epoch, as ``(batch, labels)`` pairs: the
    sequences of :func:`cpu_profile_sequences` of enough posts for at least one bucket of ``bucket_batches``
    batches (so the length sorting is the profile's), batched by :func:`bertlib.data.batches.epoch_batches`. ``batch``
    holds ``(batch, seq)`` tensors; ``labels`` is ``(batch,)``."""
    n_posts = max(bucket_batches, n_batches) * batch_size
    seqs, labels = cpu_profile_sequences(tokenizer, n_posts, max_length, windows)
    order = epoch_batches(np.array([len(s) for s in seqs]), batch_size, seed, 0, bucket_batches)
    order = [idx for idx in order if len(idx) == batch_size]
    if len(order) < n_batches:
        raise ValueError(f"asked for {n_batches} batches of {batch_size}; the training split gives {len(order)}.")
    return [(collate([seqs[i] for i in idx], tokenizer.pad_token_id, "cpu"),
             torch.as_tensor(labels[idx], dtype=torch.long)) for idx in order[:n_batches]]


def padding_share(batches) -> float:
    """The share of the batches' positions that are padding."""
    masks = [b["attention_mask"] for b, _ in batches]
    return 1.0 - sum(int(m.sum()) for m in masks) / sum(m.numel() for m in masks)


def padding_shares(lengths, batch_size: int, seed: int = 0, bucket_batches: int = 50) -> dict[str, float]:
    """The padding share of sequences of these ``lengths`` batched as a trainer without buckets batches them
    (shuffled, cut into batches) and as chapter 9's trainer does (:func:`bertlib.data.batches.epoch_batches`):
    ``{"shuffled": ..., "bucketed": ...}``."""
    lengths = np.asarray(lengths)

    def share(batches) -> float:
        return 1.0 - lengths.sum() / sum(len(b) * lengths[b].max() for b in batches)
    order = np.random.default_rng([seed, 0]).permutation(len(lengths))
    shuffled = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    return {"shuffled": float(share(shuffled)),
            "bucketed": float(share(epoch_batches(lengths, batch_size, seed, 0, bucket_batches)))}


def _bertlib_runner(pt: Pretrained, num_labels: int, attn: str, compile_: bool = False) -> Callable:
    """A function that trains chapter 9's classifier on a list of batches, one step each, and returns the
    ``time.perf_counter()`` at the end of every step; the model it trains is its ``.model``."""
    from bertlib.training.finetune import train_step
    from bertlib.training.optimization import adamw

    model = BertClassifier(pt.state_dict, pt.config, num_labels, attn_implementation=attn, fused=True).train()
    opt = adamw(model, LR, WEIGHT_DECAY)
    net = torch.compile(model) if compile_ else model

    def run(batches) -> list[float]:
        ends = []
        for batch, labels in batches:
            train_step(net, batch, labels, opt, max_grad_norm=MAX_GRAD_NORM)
            ends.append(_now(labels.device))
        return ends
    run.model = model
    return run


def _trainer_runner(pt: Pretrained, num_labels: int, device: torch.device, callbacks: tuple = ()) -> Callable:
    """The same as :func:`_bertlib_runner` through ``transformers.Trainer.train`` on ``BertForSequenceClassification``
    (SDPA, the same initial weights): a new ``Trainer`` per call, the batches fed in order, one per step, with
    ``callbacks`` (``TrainerCallback`` instances) beside the clock."""
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
            args = TrainingArguments(  # as train_step: bf16 autocast on CUDA, clipping, fused AdamW, constant lr
                output_dir=outdir, per_device_train_batch_size=1, max_steps=len(items), learning_rate=LR,
                weight_decay=WEIGHT_DECAY, max_grad_norm=MAX_GRAD_NORM, lr_scheduler_type="constant",
                optim="adamw_torch_fused", logging_strategy="no", save_strategy="no", report_to="none",
                disable_tqdm=True, dataloader_pin_memory=False, use_cpu=device.type == "cpu",
                bf16=device.type == "cuda", seed=0)
            trainer = InOrder(model=model, args=args, train_dataset=items, data_collator=lambda one: one[0],
                              callbacks=[clock, *callbacks])
            trainer.remove_callback(PrinterCallback)  # it prints the run's summary; the rows report it
            trainer.train()
        return clock.ends
    run.model = model
    return run


def training_rows(pt: Pretrained, device: torch.device, batches, rounds: int, steps: int, num_labels: int = 20,
                  compile_: bool = False) -> dict:
    """Tokens/s of one fine-tuning step by each method on ``batches`` (:func:`cpu_profile_batches`): ``rounds``
    rounds, each taking the next ``steps`` batches through every method in turn (the first step of each untimed).
    Returns ``{"rows": [...], "setup": {...}, "seconds": {method: [timed seconds per round]}}``; speed-ups are over
    ``hf Trainer``, paired within a round; the setup's ``padding_share`` and ``tokens`` are the timed batches'."""
    if len(batches) < rounds * steps or steps < 2:
        raise ValueError(f"need steps >= 2 and rounds * steps = {rounds * steps} batches, got {len(batches)}.")
    trainer = "hf Trainer (sdpa, adamw_torch_fused)"
    runners = {trainer: _trainer_runner(pt, num_labels, device),
               "bertlib, padded (sdpa, fused)": _bertlib_runner(pt, num_labels, "sdpa"),
               "bertlib, padding-free": _bertlib_runner(pt, num_labels, "unpadded")}
    compile_s = {}
    if compile_:
        name = "bertlib + torch.compile (sdpa, fused)"
        runners[name] = _bertlib_runner(pt, num_labels, "sdpa", compile_=True)
        # compiling: two batches of different lengths, so inductor marks the length dynamic before the timing
        widths = {b["input_ids"].shape[1]: (b, y) for b, y in batches}
        warm = [(_to(b, device), y.to(device)) for b, y in list(widths.values())[:2]]
        t0 = time.perf_counter()
        runners[name](warm)
        compile_s[name] = round(time.perf_counter() - t0, 1)
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
    rows = []
    for name, secs in seconds.items():
        ratio = [t / s for t, s in zip(seconds[trainer], secs, strict=True)]
        rows.append({"method": name, "tokens_per_s": round(tokens / sum(secs), 1),
                     "ms_per_step": round(1e3 * statistics.median(secs) / (steps - 1), 1),
                     "speedup_vs_trainer": round(statistics.median(ratio), 3), "speedup_min": round(min(ratio), 3),
                     "speedup_max": round(max(ratio), 3), "compile_s": compile_s.get(name)})
    setup_info = {"batch_size": int(batches[0][0]["input_ids"].shape[0]), "rounds": rounds, "steps": steps,
                  "padding_share": round(padding_share(timed), 4), "tokens": tokens,
                  "threads": torch.get_num_threads(), "model": pt.source}
    return {"rows": rows, "setup": setup_info, "seconds": seconds}


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
