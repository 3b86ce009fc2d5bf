"""Pre-training BERT: masked language modelling and next-sentence prediction (chapter 11, *Pre-training*).

Devlin et al. (2019) pre-train BERT with two objectives at once: predict 15% of the input tokens that were hidden
(MLM), and predict whether segment B followed segment A in the text (NSP). This module has the model and its
training, named as in Hugging Face's ``BertForPreTraining``: the sinusoidal position encoding of Vaswani et al.
(2017) for contrast with BERT's learned table, a freshly initialised BERT, the two heads (their math is
:mod:`bertlib.tasks.heads`', shared with chapter 15) and their summed loss, and a small trainer built on
:func:`bertlib.bert_forward`. What it reads (a word vocabulary, the masking rule, NSP pairs, tokenized pairs and
batches) is :mod:`bertlib.data.pretraining_data`; every name of both is available here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig

from bertlib.data.pretraining_data import (
    PretrainingData,
    mask_tokens,
    sample_batch,
)
from bertlib.model.checks import check_config, expected_shapes
from bertlib.model.encoder import OUTPUTS_ONLY, bert_forward
from bertlib.model.runtime import IGNORE_INDEX, normal_init, resolve_seed, seeded_generator
from bertlib.tasks.classifier import module_tree
from bertlib.tasks.heads import mlm_logits, nsp_logits, pretraining_head_shapes
from bertlib.training.optimization import adamw, optimizer_step, schedule

__all__ = [
    "PRETRAIN_ADAM_EPS", "BertPretrainingModel", "PreTrainingKwargs", "PreTrainingOutput", "PretrainRecipe",
    "TrainingHistory", "bert_for_pretraining",
    "evaluate", "init_state_dict", "optimizer_and_schedule", "pretrain", "pretraining_loss",
    "sinusoidal_position_encoding", "train_step"
]


# ---- (1) sinusoidal position encoding ------------------------------------------------------------------------------


def sinusoidal_position_encoding(max_len: int, d_model: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Vaswani et al. (2017), section 3.5: ``PE[pos, 2i] = sin(pos / 10000^(2i/d))``, ``PE[pos, 2i+1] =
    cos(pos / 10000^(2i/d))``. The frequencies are computed as ``div_term = exp(arange(0, d, 2) * -(log(10000)/d))``
    (the same numbers as ``10000^(-2i/d)``, without a large power). Returns ``(max_len, d_model)``; ``d_model``
    must be even. BERT does not use this: it learns its position table. Defined in chapter 11, *Pre-training*.
    """
    if d_model % 2:
        raise ValueError(f"d_model must be even (sin and cos pairs), got {d_model}.")
    position = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * -(math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe.to(dtype)


# ---- (2) a fresh BERT, the heads and the loss ----------------------------------------------------------------------


def init_state_dict(config: BertConfig, seed: int | None = None, *, heads: bool = True,
                    dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A freshly initialised BERT (and, with ``heads``, its pre-training heads), HF's way: every weight matrix and
    embedding table normal with standard deviation ``config.initializer_range``, biases 0, LayerNorm weight 1 and
    bias 0, and the ``[PAD]`` row (``config.pad_token_id``) of the word embeddings 0. Keys as in ``BertModel``
    plus ``cls.*``. Defined in chapter 11b, *Pre-training a small BERT from scratch*.
    """
    check_config(config)
    g = seeded_generator(seed)
    shapes = {**expected_shapes(config), **(pretraining_head_shapes(config) if heads else {})}
    sd = {}
    for name, shape in shapes.items():
        if "LayerNorm.weight" in name:
            t = torch.ones(shape, dtype=torch.float64)
        elif name.endswith("bias"):
            t = torch.zeros(shape, dtype=torch.float64)
        else:
            t = normal_init(shape, config.initializer_range, g, dtype=torch.float64)
        sd[name] = t.to(dtype)
    pad = getattr(config, "pad_token_id", None)
    if pad is not None:
        sd["embeddings.word_embeddings.weight"][pad] = 0
    return sd


def pretraining_loss(prediction_logits: torch.Tensor, seq_relationship_logits: torch.Tensor, labels: torch.Tensor,
                     next_sentence_label: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(total, mlm, nsp)``: MLM cross-entropy averaged over the positions whose label is not ``-100``, NSP
    cross-entropy averaged over the batch, and their sum (HF adds them with equal weight).
    ``prediction_logits``: ``(..., vocab)`` with ``labels`` ``(...)``; ``seq_relationship_logits``: ``(batch, 2)``.
    Defined in chapter 11, *Pre-training*.
    """
    mlm = F.cross_entropy(prediction_logits.reshape(-1, prediction_logits.shape[-1]), labels.reshape(-1),
                          ignore_index=IGNORE_INDEX)
    nsp = F.cross_entropy(seq_relationship_logits.reshape(-1, 2), next_sentence_label.reshape(-1))
    return mlm + nsp, mlm, nsp


@dataclass
class PreTrainingOutput:
    """What :func:`bert_for_pretraining` returns (HF's ``BertForPreTrainingOutput`` fields, plus the two losses)."""

    prediction_logits: torch.Tensor
    seq_relationship_logits: torch.Tensor
    loss: torch.Tensor | None = None
    mlm_loss: torch.Tensor | None = None
    nsp_loss: torch.Tensor | None = None


class PreTrainingKwargs(TypedDict, total=False):
    """The keywords of :func:`bert_for_pretraining` after its inputs (as HF's ``**kwargs: Unpack[...]``):
    ``masked_only``, and the :func:`bertlib.bert_forward` keywords it passes on (``training``,
    ``attn_implementation``, ``fused``, ``check``); it always keeps only the outputs (``OUTPUTS_ONLY``)."""

    masked_only: bool
    training: bool
    attn_implementation: str
    fused: bool
    check: bool


def bert_for_pretraining(state_dict: Mapping[str, torch.Tensor], config: BertConfig, input_ids: torch.Tensor,
                         attention_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None,
                         labels: torch.Tensor | None = None, next_sentence_label: torch.Tensor | None = None,
                         **kwargs: Unpack[PreTrainingKwargs]) -> PreTrainingOutput:
    """BERT + both pre-training heads: equals ``transformers.BertForPreTraining`` given the same weights.

    ``state_dict``: ``BertModel`` keys plus ``cls.*`` (:func:`pretraining_head_shapes`). Inputs ``(batch, seq)``.
    ``prediction_logits``: ``(batch, seq, vocab)``, or with ``masked_only`` only the rows where ``labels != -100``,
    ``(n_masked, vocab)``: the loss is the same, and it saves computing the vocabulary-sized product for the 85% of
    positions that have no label. ``seq_relationship_logits``: ``(batch, 2)``. With ``labels`` and
    ``next_sentence_label`` also the losses. The other keywords (:class:`PreTrainingKwargs`) go to
    :func:`bertlib.bert_forward`: ``training`` (dropout), ``attn_implementation``, ``fused`` (one-kernel LayerNorm
    and GELU, chapter 14; the same function). Defined in chapter 11, *Pre-training*.
    """
    masked_only = kwargs.pop("masked_only", False)
    out = bert_forward(state_dict, config, input_ids, attention_mask, token_type_ids, **kwargs, **OUTPUTS_ONLY)
    seq_out = out.last_hidden_state
    target = labels
    if masked_only:
        if labels is None:
            raise ValueError("masked_only=True needs labels (the positions to predict).")
        keep = labels != IGNORE_INDEX
        seq_out, target = seq_out[keep], labels[keep]
    result = PreTrainingOutput(mlm_logits(state_dict, config, seq_out),
                               nsp_logits(state_dict, config, out.pooler_output))
    if labels is not None and next_sentence_label is not None:
        result.loss, result.mlm_loss, result.nsp_loss = pretraining_loss(
            result.prediction_logits, result.seq_relationship_logits, target, next_sentence_label)
    return result


# ---- (3) training a small BERT from scratch ------------------------------------------------------------------------


class BertPretrainingModel(nn.Module):
    """A trainable BERT with both pre-training heads, computed by :func:`bert_for_pretraining`.

    Its ``state_dict()`` uses ``transformers.BertForPreTraining``'s names (``bert.*``, ``cls.*``; the tied decoder
    weight and bias are the same tensors as ``bert.embeddings.word_embeddings.weight`` and ``cls.predictions.bias``
    and are not stored twice), so it loads into HF with ``strict=False``. It trains with SDPA attention and one-kernel
    LayerNorm and GELU (``fused``, chapter 14): the same function as the formulas, a step of chapter 11b's small model
    about 1.6× faster on a CPU. Defined in chapter 11b.
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor], config: BertConfig, *,
                 attn_implementation: str = "sdpa", fused: bool = True) -> None:
        super().__init__()
        check_config(config)
        self.config = config
        self.attn_implementation = attn_implementation
        self.fused = fused
        self.bert = module_tree({k: v for k, v in state_dict.items() if k in expected_shapes(config)})
        self.cls = module_tree({k[len("cls."):]: v for k, v in state_dict.items()
                                 if k in pretraining_head_shapes(config)})

    def weights(self) -> dict[str, torch.Tensor]:
        """The parameters under ``bert_for_pretraining``'s names (``BertModel`` keys and ``cls.*``)."""
        return {**dict(self.bert.named_parameters()), **{"cls." + k: v for k, v in self.cls.named_parameters()}}

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, next_sentence_label=None,
                *, masked_only: bool = False) -> PreTrainingOutput:
        return bert_for_pretraining(self.weights(), self.config, input_ids, attention_mask, token_type_ids, labels,
                                    next_sentence_label, training=self.training,
                                    attn_implementation=self.attn_implementation, fused=self.fused,
                                    masked_only=masked_only)


@dataclass
class TrainingHistory:
    """Per-step losses (``mlm``, ``nsp``, ``total``) and learning rates, and the wall time of :func:`pretrain`."""

    mlm: list[float] = field(default_factory=list)
    nsp: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    seconds: float = 0.0


#: Adam's epsilon for pre-training: BERT's own (Devlin et al.'s ``optimization.py``); fine-tuning keeps
#: Hugging Face's 1e-8 (:func:`bertlib.training.optimization.adamw`).
PRETRAIN_ADAM_EPS = 1e-6


def train_step(model: BertPretrainingModel, batch: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None = None, *,
               max_grad_norm: float | None = 1.0) -> PreTrainingOutput:
    """One MLM + NSP step on ``batch`` (from :func:`sample_batch`): forward with the MLM head at the masked
    positions only, the summed loss, backward, then :func:`bertlib.training.optimization.optimizer_step` (clip the
    gradient
    norm to ``max_grad_norm``, AdamW step, schedule step, zero the gradients). Returns the forward's output (losses
    included, detached). Defined in chapter 11b."""
    out = model(**batch, masked_only=True)
    out.loss.backward()
    optimizer_step(model.parameters(), optimizer, scheduler, max_grad_norm)
    for name in ("loss", "mlm_loss", "nsp_loss", "prediction_logits", "seq_relationship_logits"):
        setattr(out, name, getattr(out, name).detach())
    return out


def optimizer_and_schedule(model: BertPretrainingModel, *, steps: int, lr: float, warmup: float = 0.1,
                           weight_decay: float = 0.01) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """What :func:`pretrain` trains with: AdamW (:func:`bertlib.training.optimization.adamw`; ``weight_decay`` on all
    but biases and LayerNorm weights, epsilon :data:`PRETRAIN_ADAM_EPS`) and a linear warm-up over the first ``warmup``
    fraction of the ``steps``, then linear decay to 0 (:func:`bertlib.training.optimization.schedule`)."""
    optimizer = adamw(model, lr, weight_decay, eps=PRETRAIN_ADAM_EPS)
    return optimizer, schedule(optimizer, steps, warmup)


@dataclass(frozen=True)
class PretrainRecipe:
    """How :func:`pretrain` trains: ``batch_size`` pairs a step, AdamW at peak rate ``lr`` with ``weight_decay``,
    a linear warm-up over the first ``warmup`` fraction of the steps then linear decay to 0
    (:func:`optimizer_and_schedule`), and ``mlm_probability`` of the tokens masked (:func:`sample_batch`).
    Defined in chapter 11b."""

    batch_size: int = 32
    lr: float = 1e-3
    warmup: float = 0.1
    weight_decay: float = 0.01
    mlm_probability: float = 0.15


def pretrain(model: BertPretrainingModel, data: PretrainingData, *, steps: int,
             recipe: PretrainRecipe = PretrainRecipe(), seed: int | None = None, max_seconds: float | None = None,
             log: Callable[[str], None] | None = None, log_every: int = 100) -> TrainingHistory:
    """Train ``model`` on MLM + NSP for ``steps`` steps (or until ``max_seconds`` have passed).

    Each step is :func:`train_step` (gradient norm clipped at 1) on a fresh :func:`sample_batch` of
    ``recipe.batch_size`` pairs, with :func:`optimizer_and_schedule`: the book's one recipe
    (:mod:`bertlib.training.optimization`), AdamW with ``recipe.weight_decay`` on all but biases and LayerNorm weights
    and a linear warm-up over the first ``recipe.warmup`` fraction of the steps, then linear decay to 0 (a
    :class:`PretrainRecipe`). Every ``log_every`` steps ``log`` gets a line of mean losses. Defined in chapter 11b.
    """
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(resolve_seed(seed))
    opt, sched = optimizer_and_schedule(model, steps=steps, lr=recipe.lr, warmup=recipe.warmup,
                                        weight_decay=recipe.weight_decay)
    hist = TrainingHistory()
    start = time.perf_counter()
    model.train()
    for step in range(steps):
        lr_now = sched.get_last_lr()[0]  # the rate this step runs at
        out = train_step(model, sample_batch(data, recipe.batch_size, g, recipe.mlm_probability, device), opt, sched)
        hist.mlm.append(out.mlm_loss.item())
        hist.nsp.append(out.nsp_loss.item())
        hist.total.append(out.loss.item())
        hist.lr.append(lr_now)
        if log is not None and (step + 1) % log_every == 0:
            k = log_every
            log(f"step {step + 1:5d}  mlm {np.mean(hist.mlm[-k:]):.3f}  nsp {np.mean(hist.nsp[-k:]):.3f}  "
                f"lr {hist.lr[-1]:.1e}  {time.perf_counter() - start:.0f} s")
        if max_seconds is not None and time.perf_counter() - start > max_seconds:
            break
    model.eval()
    hist.seconds = time.perf_counter() - start
    return hist


@torch.no_grad()
def evaluate(model: BertPretrainingModel, data: PretrainingData, *, batch_size: int = 64, seed: int | None = None,
             mlm_probability: float = 0.15) -> dict[str, float]:
    """Mean MLM loss (over masked tokens), MLM top-1 accuracy, NSP loss and NSP accuracy on ``data``, with masks
    drawn from ``seed`` (the same masks for every model evaluated with the same seed)."""
    model.eval()
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(resolve_seed(seed))
    mlm_sum = mlm_hit = nsp_sum = nsp_hit = n_tok = 0.0
    for s in range(0, len(data), batch_size):
        sl = slice(s, s + batch_size)
        masked, labels = mask_tokens(data.input_ids[sl], data.special_tokens_mask[sl], data.vocab_size,
                                     data.mask_token_id, mlm_probability, generator=g)
        nsl = data.next_sentence_label[sl].to(device)
        out = model(masked.to(device), data.attention_mask[sl].to(device), data.token_type_ids[sl].to(device),
                    labels.to(device), nsl, masked_only=True)
        target = labels[labels != IGNORE_INDEX].to(device)
        mlm_sum += F.cross_entropy(out.prediction_logits.float(), target, reduction="sum").item()
        mlm_hit += (out.prediction_logits.argmax(-1) == target).sum().item()
        n_tok += len(target)
        nsp_sum += F.cross_entropy(out.seq_relationship_logits.float(), nsl, reduction="sum").item()
        nsp_hit += (out.seq_relationship_logits.argmax(-1) == nsl).sum().item()
    return dict(mlm_loss=mlm_sum / n_tok, mlm_accuracy=mlm_hit / n_tok, nsp_loss=nsp_sum / len(data),
                nsp_accuracy=nsp_hit / len(data))
