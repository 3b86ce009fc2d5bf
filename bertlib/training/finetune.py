"""``bertlib-finetune`` (``python -m bertlib.training.finetune``): fine-tune bertlib's own
:class:`~bertlib.tasks.classifier.BertClassifier` on 20 Newsgroups.

Chapter 9, *Fine-tuning on 20 Newsgroups*, calls :func:`train` directly; the command line runs the same function::

    bertlib-finetune --profile quick --out runs/quick            # CPU, minutes, a stratified subset
    bertlib-finetune --profile full --out runs/full              # GPU: all data, 512 tokens, 4 epochs
    bertlib-finetune --profile full --out runs/full-nohdr --remove-headers

What it does: AdamW with no weight decay on biases and LayerNorm weights, a linear warm-up then linear decay of the
learning rate (both from :mod:`bertlib.training.optimization`, shared with pre-training), gradient clipping, dropout
(train
mode), bfloat16 autocast where the device multiplies bfloat16 natively (``--bf16 auto``: CPUs with avx512_bf16 or
AMX, GPUs from Ampere on; the weights and AdamW's state stay float32), length-bucketed batches, head+tail truncation
of long posts (Sun et al., 2019), a stratified validation split held out of the training posts, evaluation after
every epoch, and the best epoch's weights kept (:func:`train`). With ``--eval-windows`` validation and test score
whole posts instead of truncated ones: overlapping windows whose logits are pooled (:mod:`bertlib.data.windows`); with
``--train-windows`` training reads every window too (each labelled with its post's class); ``--tfidf-ensemble`` adds
the TF-IDF baselines and their ensemble with the model (:mod:`bertlib.evaluation.ensemble`). ``metrics.json`` holds
the error
analysis (:func:`error_analysis`). The pieces, in the order a run uses them: :class:`FinetuneConfig` (every setting,
once; the command line is generated from it), :func:`load_data`, :func:`encode`, :func:`make_optimizer`,
:func:`epoch_batches`, :func:`train_step`, :func:`train_epoch`, :func:`evaluate`, :func:`save_checkpoint` /
:func:`load_checkpoint`.

Writes ``OUT/metrics.json``, ``OUT/model.safetensors`` (the best weights, ``BertForSequenceClassification``
names), ``OUT/hf/`` (the model in Hugging Face format, see :func:`bertlib.tasks.export.export_hf`) and
``OUT/checkpoint.safetensors``. **Resuming**: a run interrupted for any reason continues from the checkpoint when
started again with the same ``--out``; the data order is a pure function of ``(seed, epoch)`` and the random
states are restored, so the resumed run ends with the same metrics as an uninterrupted one (bit for bit on CPU).
The checkpoint holds tensors and JSON only (:mod:`bertlib.training.checkpoint`): resuming never unpickles, so it cannot
run code from the file; a pickled ``checkpoint.pt`` of an older version is refused.

**More than one GPU**: the same command runs under ``torchrun`` or ``accelerate launch``
(``torchrun --nproc_per_node=4 -m bertlib.training.finetune --profile full --out runs/full-ddp``): see
:mod:`bertlib.training.distributed`. The run's parts live in their own modules, and every name chapter 9 uses is
available here too: the settings and the command line (:mod:`bertlib.training.finetune_config`), the posts and their
token ids (:mod:`bertlib.data.newsgroups`), batches (:mod:`bertlib.data`), predictions and scores
(:mod:`bertlib.evaluation.inference`), processes (:mod:`bertlib.training.distributed`), the checkpoint files
(:mod:`bertlib.training.checkpoint`),
the run's state (:mod:`bertlib.training.finetune_state`) and its report (:mod:`bertlib.training.finetune_report`). This
module is the trainer that puts them together, and the command's entry point.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bertlib.data.batches import collate, epoch_batches
from bertlib.data.newsgroups import (
    NewsData,
    encode,
    load_data,
)
from bertlib.data.windows import encode_windows
from bertlib.evaluation.features import fit_probe
from bertlib.evaluation.inference import PredictOptions, autocast, predict_logits
from bertlib.model.pretrained import Pretrained, check_max_length, load_pretrained
from bertlib.model.runtime import get_device, progress_enabled, set_seed
from bertlib.tasks.classifier import BertClassifier
from bertlib.training.checkpoint import (
    BEST,
    CHECKPOINT,
    LEGACY_CHECKPOINT,
    load_checkpoint,
    rng_state,
    save_checkpoint,
    save_weights,
    set_rng_state,
)
from bertlib.training.distributed import (
    Distributed,
    init_distributed,
    launched_world_size,
    rank_seed,
    rank_share,
)
from bertlib.training.finetune_config import (
    FinetuneConfig,
    parse_args,
    settings_clash,
    use_bf16,
)
from bertlib.training.finetune_report import evaluate_split, finish
from bertlib.training.finetune_state import FinetuneResult, Run, TrainState
from bertlib.training.optimization import adamw, optimizer_step, schedule, warmup_steps

__all__ = [
    "CommandLine", "build_model", "end_epoch", "head_inputs", "main", "make_optimizer", "make_scheduler",
    "probe_head", "train", "train_epoch", "train_step",
]


# ---------------------------------------------------------------------------------------- one step, by hand


def build_model(cfg: FinetuneConfig, pretrained: Pretrained, num_labels: int, device: torch.device) -> BertClassifier:
    """:class:`~bertlib.tasks.classifier.BertClassifier` on the pretrained weights (float32, on ``device``), its new
    layer initialised
    from ``cfg.seed``. With ``cfg.dropout`` set, the model trains with a copy of the config carrying that dropout;
    ``pretrained.config`` keeps the model's own values (exported). LayerNorm and GELU run fused (chapter 14)."""
    config = pretrained.config
    if cfg.dropout is not None:
        config = copy.deepcopy(config)
        config.hidden_dropout_prob = config.attention_probs_dropout_prob = cfg.dropout
        config.classifier_dropout = cfg.dropout
    sd = {k: v.to(device=device, dtype=torch.float32) for k, v in pretrained.state_dict.items()}
    return BertClassifier(sd, config, num_labels, seed=cfg.seed, attn_implementation=cfg.attn, fused=True,
                          pooling=cfg.pooling).to(device)


def head_inputs(model: BertClassifier, seqs: list[list[int]], pad_id: int, bf16: bool | None = None,
                batch_size: int = 64) -> np.ndarray:
    """``(len(seqs), hidden)`` float32: the vector ``model``'s new layer reads for every sequence
    (:meth:`~bertlib.tasks.classifier.BertClassifier.pooled`), batched as
    :func:`~bertlib.evaluation.inference.predict_logits` batches the logits. Defined in chapter 9, *Fine-tuning on
    20 Newsgroups*."""
    options = PredictOptions(batch_size=batch_size, bf16=bf16)
    return predict_logits(model, seqs, pad_id, options, forward=model.pooled).numpy()


@torch.no_grad()
def probe_head(model: BertClassifier, train: tuple[list[list[int]], np.ndarray],
               val: tuple[list[list[int]], np.ndarray], pad_id: int, bf16: bool | None = None) -> dict:
    """Linear probing, then fine-tuning (Kumar et al. 2022): set ``model``'s new layer to the logistic regression
    on the frozen vectors it reads (:func:`head_inputs`) of the ``train`` ``(token ids, labels)``, its ``C`` chosen
    on ``val`` (:func:`bertlib.evaluation.features.fit_probe`). The vectors are centred and divided by one number,
    their overall spread ``s``, and that is folded into the layer: ``W = coef / s``, ``b = intercept - W·m``. (Not
    one spread per coordinate: a coordinate that hardly varies over the training posts would get a weight of
    ``coef / ~0``, and the first change fine-tuning makes to it would swamp the logits.) Fine-tuning then starts
    from a layer that already separates the classes, instead of sending a random layer's gradients into the
    pre-trained encoder. Returns ``{"C", "val_accuracy"}``. Defined in chapter 9, *Fine-tuning on 20 Newsgroups*."""
    (train_seqs, y_train), (val_seqs, y_val) = train, val
    missing = sorted(set(range(model.num_labels)) - set(np.asarray(y_train).tolist()))
    if missing:
        raise ValueError(f"head_init='probe' needs training posts of every class; classes {missing} have none. "
                         "Draw more training posts (--train-size) or use --head-init random.")
    v_train, v_val = head_inputs(model, train_seqs, pad_id, bf16), head_inputs(model, val_seqs, pad_id, bf16)
    mean, spread = v_train.mean(0), float((v_train - v_train.mean(0)).std())       # (hidden,), one number
    probe = fit_probe((v_train - mean) / spread, y_train, (v_val - mean) / spread, y_val, standardize=False)
    logreg = probe.model[-1]
    weight = logreg.coef_ / spread                                                  # (C, hidden)
    layer = model.classifier
    layer.weight.copy_(torch.as_tensor(weight, dtype=layer.weight.dtype))
    layer.bias.copy_(torch.as_tensor(logreg.intercept_ - weight @ mean, dtype=layer.bias.dtype))
    return {"C": probe.C, "val_accuracy": probe.val_accuracy}


def make_optimizer(model: BertClassifier, cfg: FinetuneConfig) -> torch.optim.AdamW:
    """AdamW (:func:`bertlib.training.optimization.adamw`): ``cfg.weight_decay`` on all but biases and LayerNorm
    weights, the encoder at ``cfg.lr``, the new ``classifier.*`` layer at ``cfg.head_lr``."""
    return adamw(model, cfg.lr, cfg.weight_decay, head_prefix="classifier.", head_lr=cfg.head_lr)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: FinetuneConfig, total_steps: int):
    """Linear warm-up over ``ceil(cfg.warmup_ratio * total_steps)`` steps, then linear decay to 0
    (``transformers.get_linear_schedule_with_warmup``)."""
    return schedule(optimizer, total_steps, cfg.warmup_ratio)


def train_step(model: torch.nn.Module, batch: dict[str, torch.Tensor], labels: torch.Tensor,
               optimizer: torch.optim.Optimizer, scheduler=None, *, max_grad_norm: float | None = 1.0,
               loss_weight: float | None = None, bf16: bool | None = None) -> torch.Tensor:
    """One optimiser step: forward in train mode (bfloat16 autocast with ``bf16``; None: on CUDA only) →
    cross-entropy (float32) → backward → clip the gradient norm → AdamW step → schedule step → zero the gradients
    (:func:`bertlib.training.optimization.optimizer_step`). The weights, their gradients and AdamW's state stay float32.

    ``batch``: :func:`collate`'s ``(batch, seq)`` tensors; ``labels``: ``(batch,)`` class indices. The loss is the
    batch's mean cross-entropy, or with ``loss_weight`` (a DDP rank's share, :func:`rank_share`) its *summed*
    cross-entropy times ``loss_weight``. ``model`` may be wrapped in ``DistributedDataParallel``. Returns the loss
    (detached). Defined in chapter 9, *Fine-tuning on 20 Newsgroups*, which writes the same step out by hand."""
    with autocast(labels.device, bf16):
        logits = model(**batch)
        if loss_weight is None:
            loss = F.cross_entropy(logits.float(), labels)
        else:
            loss = F.cross_entropy(logits.float(), labels, reduction="sum") * loss_weight
    loss.backward()
    optimizer_step(model.parameters(), optimizer, scheduler, max_grad_norm)
    return loss.detach()


# ------------------------------------------------------------------------------------------------- the loop


@dataclass(frozen=True)
class CommandLine:
    """What a command line adds to a call of :func:`train`: the 20 Newsgroups archive it names (None:
    ``$BERTLIB_20NG_ARCHIVE``) and the command itself, recorded in ``metrics.json``."""

    archive: str | os.PathLike | None = None
    command: str | None = None


def train(
    cfg: FinetuneConfig,
    out_dir: str | os.PathLike,
    *,
    data: NewsData | None = None,
    pretrained: Pretrained | None = None,
    stop_after_steps: int | None = None,
    export: bool = True,
    verbose: bool = True,
    cli: CommandLine | None = None,
) -> FinetuneResult | None:
    """Fine-tune :class:`~bertlib.tasks.classifier.BertClassifier` as ``cfg`` says, resuming from
    ``out_dir/checkpoint.safetensors``.

    ``data`` (from :func:`load_data` or :func:`split_data`) and ``pretrained`` (from
    :func:`bertlib.load_pretrained`) may be passed in to reuse what is already loaded. ``stop_after_steps``
    simulates an interruption: after that many optimizer steps (counted from the start of training, not of this
    call) the checkpoint is written and ``None`` is returned. Otherwise returns a :class:`FinetuneResult` after
    writing ``metrics.json``, ``model.safetensors`` and (``export=True``) the Hugging Face directory ``hf/``.
    Under ``torchrun`` every process calls it and trains with DistributedDataParallel (see the module's
    docstring); only rank 0 writes files, and every rank returns the same metrics. ``cli`` (from the command line:
    :class:`CommandLine`) names the 20 Newsgroups archive and the command, which ``metrics.json`` records.
    Defined in chapter 9, *Fine-tuning on 20 Newsgroups*.
    """
    t_call = time.perf_counter()
    device = torch.device(cfg.device) if cfg.device else get_device()
    world = launched_world_size()
    if cfg.batch_size % world:
        raise ValueError(
            f"batch_size {cfg.batch_size} is not a multiple of the {world} processes (WORLD_SIZE): the global batch "
            "is split evenly over them. Choose --batch-size k*N or another --nproc_per_node."
        )
    ddp = init_distributed(device)
    try:
        if ddp.enabled and device.type == "cuda":
            device = torch.device("cuda", ddp.local_rank)
        cli = cli or CommandLine()
        loaded = _prepare(cfg, Path(out_dir), ddp, pretrained, data, cli.archive)
        run = _setup(cfg, Path(out_dir), device, ddp, t_call, *loaded, verbose=verbose)
        run.command = cli.command
        from tqdm import tqdm

        run.bar = tqdm(total=run.total_steps, initial=run.state.step, desc="fine-tuning", unit="step",
                       dynamic_ncols=True, disable=not progress_enabled() or not verbose or not ddp.main)
        while not run.state.finished:
            if train_epoch(run, stop_after_steps):
                run.bar.close()
                run.say(f"[finetune] stopped after {run.state.step} steps (--stop-after-steps); checkpoint at "
                        f"{run.out / CHECKPOINT}. Run the same command again to resume.")
                return None
            end_epoch(run)
        run.bar.close()
        return finish(run, export)
    finally:
        ddp.close()


def _prepare(cfg: FinetuneConfig, out: Path, ddp: Distributed, pretrained: Pretrained | None,
             data: NewsData | None, archive: str | os.PathLike | None) -> tuple[Pretrained, NewsData]:
    """The output folder and the seeds, then the model and the posts (those passed in, else loaded; ``archive``:
    the 20 Newsgroups archive, None for ``$BERTLIB_20NG_ARCHIVE``). The model's limits are checked before the
    data is read."""
    if ddp.main:
        out.mkdir(parents=True, exist_ok=True)
    set_seed(cfg.seed)
    if ddp.rank > 0:
        torch.manual_seed(rank_seed(cfg.seed, ddp.rank))  # this rank's own dropout masks; rank 0's are a single run's
    with ddp.main_first():  # rank 0 alone fills scikit-learn's cache from the archive, if it is empty
        pretrained = pretrained if pretrained is not None else load_pretrained(cfg.model)
        check_max_length(cfg.max_length, pretrained)  # the model's limits are known now: before the data and training
        if data is None:
            data = load_data(cfg, remove_headers=cfg.remove_headers, archive=archive)
    return pretrained, data


def _setup(cfg: FinetuneConfig, out: Path, device: torch.device, ddp: Distributed, t_call: float,
           pretrained: Pretrained, data: NewsData, *, verbose: bool) -> Run:
    """Token ids, model, optimiser and schedule for the model and posts of :func:`_prepare`; then a fresh start or a
    resume."""
    seqs = {split: encode(pretrained.tokenizer, getattr(data, split).texts, cfg.max_length, cfg.truncation)
            for split in ("train", "val", "test")}
    post_index = {}
    for split in (("train",) if cfg.train_windows else ()) + (("val", "test") if cfg.eval_windows else ()):
        seqs[split], post_index[split] = encode_windows(pretrained.tokenizer, getattr(data, split).texts,
                                                        cfg.max_length, cfg.window_stride)
    model = build_model(cfg, pretrained, len(data.label_names), device)
    optimizer = make_optimizer(model, cfg)
    lengths = np.array([len(s) for s in seqs["train"]])
    steps_per_epoch = len(epoch_batches(lengths, cfg.batch_size, cfg.seed, 0, cfg.bucket_batches))
    total_steps = cfg.epochs * steps_per_epoch if cfg.max_steps is None else min(cfg.epochs * steps_per_epoch,
                                                                                  cfg.max_steps)
    run = Run(cfg, out, device, ddp, pretrained, data, seqs, model, model, optimizer,
              make_scheduler(optimizer, cfg, total_steps), steps_per_epoch, total_steps, t_call,
              say=print if verbose and ddp.main else (lambda *a, **k: None),
              state=TrainState(examples_per_rank=[0] * ddp.world_size), post_index=post_index,
              bf16=use_bf16(cfg.bf16, device))
    if ddp.all_gather((out / CHECKPOINT).exists() or (out / LEGACY_CHECKPOINT).exists())[0]:  # rank 0 decides
        _resume(run, load_checkpoint(out / CHECKPOINT))
    elif cfg.head_init == "probe":  # every rank fits the same probe (no random draws), before DDP wraps the model
        val = seqs["val"] if not cfg.eval_windows else encode(pretrained.tokenizer, data.val.texts, cfg.max_length,
                                                                   cfg.truncation)  # truncated, as trained
        run.state.probe = probe_head(model, (seqs["train"], run.train_labels), (val, data.val.labels),
                                     pretrained.tokenizer.pad_token_id, run.bf16)
    run.state.segments += 1
    run.wall_before = run.state.wall_time
    run.seen = run.state.examples_per_rank[ddp.rank]
    if ddp.enabled:
        from torch.nn.parallel import DistributedDataParallel

        # DDP broadcasts rank 0's weights now, then all-reduces (averages) the gradients in every backward
        run.net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    run.say(f"[finetune] profile={cfg.profile} device={device} model={pretrained.name} "
            f"train={len(data.train)} val={len(data.val)} test={len(data.test)} remove_headers={cfg.remove_headers} "
            f"max_length={cfg.max_length} truncation={cfg.truncation} epochs={cfg.epochs} batch={cfg.batch_size} "
            f"precision={'bf16 autocast' if run.bf16 else 'float32'} "
            + (f"eval_windows(overlap={cfg.window_stride} tokens, pool={cfg.window_pool}, val={len(seqs['val'])}, "
               f"test={len(seqs['test'])} windows) " if cfg.eval_windows else "")
            + (f"train_windows({len(seqs['train'])} windows) " if cfg.train_windows else "")
            + f"steps={total_steps} warmup={warmup_steps(total_steps, cfg.warmup_ratio)} lr={cfg.lr:g} "
            f"head_lr={cfg.head_lr or cfg.lr:g} seed={cfg.seed}"
            + (f" world_size={ddp.world_size} backend={ddp.backend} per_rank_batch={cfg.batch_size // ddp.world_size}"
               if ddp.enabled else ""))
    return run


def train_epoch(run: Run, stop_after_steps: int | None = None) -> bool:
    """The rest of the current epoch (from ``run.state.batch``), a checkpoint every ``cfg.checkpoint_every``
    steps. Returns True when it stopped at ``stop_after_steps`` (a simulated interruption, checkpoint written)."""
    cfg, st, ddp = run.cfg, run.state, run.ddp
    lengths = run.lengths
    batches = epoch_batches(lengths, cfg.batch_size, cfg.seed, st.epoch, cfg.bucket_batches)
    t0 = time.perf_counter()
    while st.batch < len(batches) and st.step < run.total_steps:
        idx = batches[st.batch]
        # under DDP: this rank's contiguous share, its summed loss weighted by world/len(idx)
        mine, weight = rank_share(idx, ddp.rank, ddp.world_size) if ddp.enabled else (idx, None)
        batch = collate([run.seqs["train"][i] for i in mine], run.pretrained.tokenizer.pad_token_id, run.device)
        labels = torch.as_tensor(run.train_labels[mine], dtype=torch.long).to(run.device, non_blocking=True)
        loss = train_step(run.net, batch, labels, run.optimizer, run.scheduler, max_grad_norm=cfg.max_grad_norm,
                          loss_weight=weight, bf16=run.bf16)
        _record_step(run, loss, len(mine) if weight != 0.0 else 0, int(lengths[idx].sum()))
        stop = stop_after_steps is not None and st.step >= stop_after_steps
        if st.step % cfg.checkpoint_every == 0 or stop:
            st.train_time += time.perf_counter() - t0
            _checkpoint(run)
            t0 = time.perf_counter()  # writing checkpoints is not training time
        if stop:
            return True
    st.train_time += time.perf_counter() - t0
    return False


def _record_step(run: Run, loss: torch.Tensor, posts: int, tokens: int) -> None:
    """Log one step: its loss (under DDP the global batch's mean, as a single process logs it), posts, tokens."""
    st = run.state
    if run.ddp.enabled:  # every rank's loss is its summed loss × world/n: the sum over ranks / world is the mean
        import torch.distributed as dist

        total = loss.reshape(1).clone()
        dist.all_reduce(total)
        step_loss = total.item() / run.ddp.world_size
    else:
        step_loss = loss.item()
    run.seen += posts
    st.loss_sum += step_loss
    st.loss_curve.append(step_loss)
    st.loss_batches += 1
    st.tokens += tokens
    st.step += 1
    st.batch += 1
    if run.bar is not None:
        run.bar.update(1)
        if st.step % 10 == 0:
            run.bar.set_postfix(loss=f"{st.loss_sum / st.loss_batches:.3f}")


def end_epoch(run: Run) -> None:
    """After an epoch (or ``max_steps``): validate, record the epoch, keep the best weights, write a checkpoint."""
    cfg, st, ddp = run.cfg, run.state, run.ddp
    val, val_logits = evaluate_split(run, "val")
    entry = {"epoch": st.epoch + 1, "step": st.step, "train_loss": st.loss_sum / max(1, st.loss_batches),
             "val_loss": val["loss"], "val_accuracy": val["accuracy"], "val_macro_f1": val["macro_f1"],
             "lr": run.scheduler.get_last_lr()[0], "train_time_s": st.train_time}
    st.history.append(entry)
    if val["accuracy"] > st.best_val_accuracy:
        st.best_val_accuracy, st.best_epoch = val["accuracy"], entry["epoch"]
        run.best_val_logits = val_logits
        if ddp.main:
            save_weights(run.model, run.out / BEST, {"epoch": entry["epoch"], "val_accuracy": val["accuracy"]})
    run.say(f"[finetune] epoch {entry['epoch']}/{cfg.epochs} step {st.step}/{run.total_steps} "
            f"train_loss {entry['train_loss']:.4f} val_loss {val['loss']:.4f} val_acc {val['accuracy']:.4f} "
            f"val_macro_f1 {val['macro_f1']:.4f} {st.train_time:.0f}s "
            f"{st.tokens / max(st.train_time, 1e-9):,.0f} tok/s")
    st.epoch += 1
    st.batch, st.loss_sum, st.loss_batches = 0, 0.0, 0
    st.finished = st.epoch >= cfg.epochs or st.step >= run.total_steps
    _checkpoint(run)


# -------------------------------------------------------------------------------------- checkpoints, resume


def _checkpoint(run: Run) -> None:
    """Every rank calls it (its random state is gathered); rank 0 writes."""
    run.state.wall_time = run.elapsed()
    gathered = run.ddp.all_gather((rng_state(run.local), run.seen))
    run.state.examples_per_rank = [n for _, n in gathered]
    if run.ddp.main:
        save_checkpoint(run.out / CHECKPOINT, model=run.model, optimizer=run.optimizer, scheduler=run.scheduler,
                        state=run.state, cfg=run.cfg, rng_ranks=[state for state, _ in gathered])


def _resume(run: Run, ckpt: dict) -> None:
    """Continue from ``ckpt``: weights, optimiser, schedule, state and this rank's random states."""
    cfg, ddp = run.cfg, run.ddp
    clash = settings_clash(ckpt["config"], cfg)
    if clash:
        raise ValueError(
            f"{run.out / CHECKPOINT} was written by a run with other settings ({clash}, as (saved, now)). Use "
            "another --out directory, or delete the checkpoint to start afresh.")
    run.model.load_state_dict(ckpt["model"], strict=True)
    run.optimizer.load_state_dict(ckpt["optimizer"])
    run.scheduler.load_state_dict(ckpt["scheduler"])
    run.state = TrainState(**ckpt["state"])
    states = ckpt["rng_ranks"]
    if len(states) == ddp.world_size:
        set_rng_state(states[ddp.rank], run.local)
    else:  # another number of processes: same global batches, but ranks > 0 draw fresh dropout masks
        set_rng_state(states[0], run.local)
        if ddp.rank > 0:
            torch.manual_seed(rank_seed(cfg.seed, ddp.rank, run.state.step))
        run.say(f"[finetune] the checkpoint was written by {len(states)} process(es), this run has "
                f"{ddp.world_size}: training goes on from the same state, with other dropout masks than an "
                "uninterrupted run")
    if len(run.state.examples_per_rank) != ddp.world_size:
        run.state.examples_per_rank = [0] * ddp.world_size  # counted from here on
    run.say(f"[finetune] resuming from {run.out / CHECKPOINT}: step {run.state.step}/{run.total_steps}, epoch "
            f"{run.state.epoch + 1}, batch {run.state.batch}/{run.steps_per_epoch}")


# ---------------------------------------------------------------------------------------------- the command


def main(argv: list[str] | None = None) -> int:
    """``python -m bertlib.training.finetune ARGS``: :func:`parse_args`, then :func:`train`; 0 when the run finished (or
    stopped where ``--stop-after-steps`` asked)."""
    cfg, cmd = parse_args(argv)
    device = torch.device(cfg.device) if cfg.device else get_device()
    if os.environ.get("RANK", "0") == "0":  # under torchrun, rank 0 speaks for all
        if device.type != "cuda" and cfg.profile == "full":
            print("[finetune] warning: the full profile on CPU takes hours; it is meant for a GPU", flush=True)
        print(f"[finetune] profile {cfg.profile}: {json.dumps(cfg.to_dict())}", flush=True)
    import transformers

    transformers.logging.set_verbosity_error()
    command = shlex.join(["python", "-m", "bertlib.training.finetune", *(sys.argv[1:] if argv is None else argv)])
    result = train(cfg, cmd.out, stop_after_steps=cmd.stop_after_steps, export=not cmd.no_export,
                   cli=CommandLine(archive=cmd.archive, command=command))
    return 0 if result is not None or cmd.stop_after_steps is not None else 1


if __name__ == "__main__":
    sys.exit(main())
