"""Where a fine-tuning run stands (chapter 9): :class:`TrainState`, saved in every checkpoint and restored on
resume; :class:`Run`, everything one call of :func:`bertlib.training.finetune.train` works with; and
:class:`FinetuneResult`, what it returns."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bertlib.data.newsgroups import NewsData
from bertlib.model.pretrained import Pretrained
from bertlib.tasks.classifier import BertClassifier
from bertlib.training.distributed import Distributed
from bertlib.training.finetune_config import FinetuneConfig


@dataclass
class TrainState:
    """Where a run stands: saved (as JSON) in every checkpoint, restored on resume."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epochs completed
    batch: int = 0  # batches of the current epoch already trained
    loss_sum: float = 0.0  # this epoch's summed step losses ...
    loss_batches: int = 0  # ... over this many steps
    tokens: int = 0
    train_time: float = 0.0
    wall_time: float = 0.0  # every segment of a resumed run
    history: list[dict] = field(default_factory=list)  # one entry per epoch
    loss_curve: list[float] = field(default_factory=list)  # every step's loss (the global batch's mean)
    best_val_accuracy: float = -1.0
    best_epoch: int | None = None
    finished: bool = False
    segments: int = 0  # calls of train() that worked on this run
    examples_per_rank: list[int] = field(default_factory=list)
    probe: dict | None = None  # head_init="probe": the C validation chose and the probe's validation accuracy


@dataclass
class Run:
    """What one call of :func:`train` works with."""

    cfg: FinetuneConfig
    out: Path
    device: torch.device
    ddp: Distributed
    pretrained: Pretrained
    data: NewsData
    seqs: dict[str, list[list[int]]]  # "train", "val", "test": token ids of every post (or of its windows)
    model: BertClassifier
    net: torch.nn.Module  # what the training step calls: the model, or its DistributedDataParallel wrapper
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    steps_per_epoch: int
    total_steps: int
    t_call: float
    say: object = print
    state: TrainState = field(default_factory=TrainState)
    wall_before: float = 0.0  # wall time of earlier segments
    seen: int = 0  # training posts this rank has run through the model
    bar: object = None
    post_index: dict[str, np.ndarray] = field(default_factory=dict)  # splits in windows: window → post
    best_val_logits: torch.Tensor | None = None  # the best epoch's, when this call saw it (not kept on resume)
    command: str | None = None  # the command line that started this call, for metrics.json
    bf16: bool = False  # bfloat16 autocast in training and evaluation (finetune_config.use_bf16)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(s) for s in self.seqs["train"]])

    @property
    def train_labels(self) -> np.ndarray:
        """The class of each training sequence: its post's (``train_windows``: every window its post's class)."""
        labels = self.data.train.labels
        return labels[self.post_index["train"]] if "train" in self.post_index else labels

    @property
    def local(self) -> torch.device | None:
        """Under DDP on CUDA, this rank's GPU (the only one whose random state it keeps)."""
        return self.device if self.ddp.enabled and self.device.type == "cuda" else None

    def elapsed(self) -> float:
        return self.wall_before + time.perf_counter() - self.t_call


@dataclass
class FinetuneResult:
    """What :func:`train` returns: the metrics (also in ``metrics.json``), the classifier holding the best weights
    (eval mode), its tokenizer, the data it saw, and the test set's logits and predicted classes."""

    metrics: dict
    model: BertClassifier
    tokenizer: object
    data: NewsData
    test_logits: torch.Tensor
    test_pred: np.ndarray
    out_dir: Path
    history: list[dict] = field(default_factory=list)
