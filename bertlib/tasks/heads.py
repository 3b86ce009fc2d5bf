"""One encoder, many heads (chapter 15, *One encoder, many heads*): the task heads of Hugging Face's ``BertFor*``
classes as small functions on top of the encoder, with their losses.

A head reads the output of :func:`bertlib.bert_forward`: ``last_hidden_state`` ``(batch, seq, hidden)`` (HF's
``sequence_output``; ``add_pooling_layer=False`` as in the classes without a pooler) or ``pooler_output``
``(batch, hidden)``. ``config.is_decoder=True`` makes ``bert_forward`` causal (``BertLMHeadModel``). Each head reads
its weights from the same flat state dict as the encoder, under the names HF gives them without the ``bert.``
prefix (``classifier.*``, ``qa_outputs.*``, ``cls.*``): :func:`state_dict_from_hf` turns any ``BertFor*`` model
into that one dict. The heads:

| function | HF class | reads | outputs |
| --- | --- | --- | --- |
| :func:`masked_lm` | ``BertForMaskedLM`` | every token | ``(batch, seq, vocab)`` |
| :func:`causal_lm` | ``BertLMHeadModel`` | every token, causal mask | ``(batch, seq, vocab)``, shifted loss |
| :func:`next_sentence` | ``BertForNextSentencePrediction`` | pooled ``[CLS]`` | ``(batch, 2)`` |
| :func:`token_classification` | ``BertForTokenClassification`` | every token | ``(batch, seq, num_labels)`` |
| :func:`question_answering` | ``BertForQuestionAnswering`` | every token | start and end ``(batch, seq)`` |
| :func:`multiple_choice` | ``BertForMultipleChoice`` | pooled ``[CLS]`` per choice | ``(batch, num_choices)`` |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig

from bertlib.model.layer import activation
from bertlib.model.layer_norm import layer_norm
from bertlib.model.pretrained import split_bert_state_dict
from bertlib.model.runtime import IGNORE_INDEX
from bertlib.tasks.classifier import classifier_dropout_prob


@dataclass
class HeadOutput:
    """A head's ``logits`` and, when labels were given, its ``loss`` (HF's ``*Output`` field names)."""

    logits: torch.Tensor
    loss: torch.Tensor | None = None


@dataclass
class SpanOutput:
    """:func:`question_answering`'s ``start_logits`` and ``end_logits`` ``(batch, seq)`` and its ``loss``."""

    start_logits: torch.Tensor
    end_logits: torch.Tensor
    loss: torch.Tensor | None = None


# ---- the pre-training heads' math (chapter 11), which the task heads below reuse -----------------------------------


def pretraining_head_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """The parameters of HF's ``BertPreTrainingHeads`` (keys ``cls.*``), without the decoder weight, which is tied
    to ``embeddings.word_embeddings.weight``."""
    H = config.hidden_size
    return {
        "cls.predictions.transform.dense.weight": (H, H),
        "cls.predictions.transform.dense.bias": (H,),
        "cls.predictions.transform.LayerNorm.weight": (H,),
        "cls.predictions.transform.LayerNorm.bias": (H,),
        "cls.predictions.bias": (config.vocab_size,),
        "cls.seq_relationship.weight": (2, H),
        "cls.seq_relationship.bias": (2,),
    }


def mlm_transform(state_dict: Mapping[str, torch.Tensor], config: BertConfig,
                  sequence_output: torch.Tensor) -> torch.Tensor:
    """``LayerNorm(act(h W_T^T + b_T))``: HF's ``BertPredictionHeadTransform``. ``(..., hidden)`` in and out."""
    p = "cls.predictions.transform."
    h = F.linear(sequence_output, state_dict[p + "dense.weight"], state_dict[p + "dense.bias"])
    h = activation(config.hidden_act)(h)
    return layer_norm(h, state_dict[p + "LayerNorm.weight"], state_dict[p + "LayerNorm.bias"], config.layer_norm_eps)


def mlm_logits(state_dict: Mapping[str, torch.Tensor], config: BertConfig,
               sequence_output: torch.Tensor) -> torch.Tensor:
    """The MLM head: ``transform(h) E^T + b`` with ``E`` the word-embedding table (the decoder is *tied* to the
    input embeddings) and ``b`` = ``cls.predictions.bias``. ``(..., hidden)`` → ``(..., vocab_size)``.
    Defined in chapter 11, *Pre-training* (HF ``BertLMPredictionHead``); here for chapter 15 too.
    """
    h = mlm_transform(state_dict, config, sequence_output)
    return F.linear(h, state_dict["embeddings.word_embeddings.weight"], state_dict["cls.predictions.bias"])


def nsp_logits(state_dict: Mapping[str, torch.Tensor], config: BertConfig, pooled_output: torch.Tensor) -> torch.Tensor:
    """The NSP head: one linear layer on the pooled ``[CLS]`` vector, ``(batch, hidden)`` → ``(batch, 2)``
    (column 0 = IsNext, 1 = NotNext). Defined in chapter 11, *Pre-training* (HF ``cls.seq_relationship``)."""
    return F.linear(pooled_output, state_dict["cls.seq_relationship.weight"], state_dict["cls.seq_relationship.bias"])


# ---- the task heads (chapter 15) -----------------------------------------------------------------------------------


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """Mean cross-entropy over the positions whose label is not ``-100`` (``None`` without labels)."""
    if labels is None:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX)


_MLM_KEYS = ("cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
             "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
             "cls.predictions.bias", "embeddings.word_embeddings.weight")


def require_head(state_dict: Mapping[str, torch.Tensor], keys: tuple[str, ...], hf_class: str) -> None:
    """Every weight a head reads is in ``state_dict``, else one ``ValueError`` naming the missing ones and the fix."""
    missing = [k for k in keys if k not in state_dict]
    if missing:
        raise ValueError(
            f"{hf_class}'s head reads {', '.join(missing)}, which the state dict lacks. Pass the encoder's and the "
            f"head's weights in one dict, e.g. bertlib.tasks.heads.state_dict_from_hf({hf_class}(...)), or {{**sd, "
            "**head_weights}} with the head's keys as Hugging Face names them (no 'bert.' prefix).")


def masked_lm(state_dict: Mapping[str, torch.Tensor], config: BertConfig, sequence_output: torch.Tensor,
              labels: torch.Tensor | None = None) -> HeadOutput:
    """``BertForMaskedLM``'s head: the MLM head of chapter 11 (transform, then the decoder tied to the word
    embeddings) on every token, ``(batch, seq, hidden)`` → ``(batch, seq, vocab)``; the loss is the cross-entropy
    over the positions whose label is not ``-100``. Defined in chapter 15, *One encoder, many heads*."""
    require_head(state_dict, _MLM_KEYS, "BertForMaskedLM")
    logits = mlm_logits(state_dict, config, sequence_output)
    return HeadOutput(logits, _cross_entropy(logits, labels))


def causal_lm(state_dict: Mapping[str, torch.Tensor], config: BertConfig, sequence_output: torch.Tensor,
              labels: torch.Tensor | None = None) -> HeadOutput:
    """``BertLMHeadModel``'s head: the same MLM head, read on a decoder's (causal) hidden states. Position ``t``
    predicts token ``t + 1``, so the loss compares ``logits[:, :-1]`` with ``labels[:, 1:]`` (labels are the input
    ids, ``-100`` where no loss is wanted). ``(batch, seq, hidden)`` → ``(batch, seq, vocab)``.
    Defined in chapter 15, *One encoder, many heads*."""
    require_head(state_dict, _MLM_KEYS, "BertLMHeadModel")
    logits = mlm_logits(state_dict, config, sequence_output)
    loss = None if labels is None else _cross_entropy(logits[:, :-1], labels[:, 1:])
    return HeadOutput(logits, loss)


def next_sentence(state_dict: Mapping[str, torch.Tensor], config: BertConfig, pooled_output: torch.Tensor,
                  labels: torch.Tensor | None = None) -> HeadOutput:
    """``BertForNextSentencePrediction``'s head: chapter 11's NSP layer on the pooled ``[CLS]`` vector,
    ``(batch, hidden)`` → ``(batch, 2)`` (0 = IsNext, 1 = NotNext). Defined in chapter 15."""
    require_head(state_dict, ("cls.seq_relationship.weight", "cls.seq_relationship.bias"),
                 "BertForNextSentencePrediction")
    logits = nsp_logits(state_dict, config, pooled_output)
    return HeadOutput(logits, _cross_entropy(logits, labels))


def token_classification(state_dict: Mapping[str, torch.Tensor], config: BertConfig, sequence_output: torch.Tensor,
                         labels: torch.Tensor | None = None, *, training: bool = False) -> HeadOutput:
    """``BertForTokenClassification``'s head: dropout, then one linear layer (``classifier.*``) on every token,
    ``(batch, seq, hidden)`` → ``(batch, seq, num_labels)``; labels ``(batch, seq)``, ``-100`` on positions
    without one (padding, special tokens, a word's later pieces). Defined in chapter 15."""
    require_head(state_dict, ("classifier.weight", "classifier.bias"), "BertForTokenClassification")
    h = F.dropout(sequence_output, classifier_dropout_prob(config), training)
    logits = F.linear(h, state_dict["classifier.weight"], state_dict["classifier.bias"])
    return HeadOutput(logits, _cross_entropy(logits, labels))


def question_answering(state_dict: Mapping[str, torch.Tensor], config: BertConfig, sequence_output: torch.Tensor,
                       start_positions: torch.Tensor | None = None,
                       end_positions: torch.Tensor | None = None) -> SpanOutput:
    """``BertForQuestionAnswering``'s head: a linear layer (``qa_outputs.*``, two outputs) on every token, split
    into start and end scores ``(batch, seq)``. The loss is the mean of the start and end cross-entropies over the
    sequence; positions outside ``[0, seq)`` are clamped to ``seq`` and ignored, as in HF. Defined in chapter 15."""
    require_head(state_dict, ("qa_outputs.weight", "qa_outputs.bias"), "BertForQuestionAnswering")
    logits = F.linear(sequence_output, state_dict["qa_outputs.weight"], state_dict["qa_outputs.bias"])
    start, end = (t.squeeze(-1) for t in logits.split(1, dim=-1))
    loss = None
    if start_positions is not None and end_positions is not None:
        seq = start.shape[1]
        s, e = start_positions.reshape(-1).clamp(0, seq), end_positions.reshape(-1).clamp(0, seq)
        loss = (F.cross_entropy(start, s, ignore_index=seq) + F.cross_entropy(end, e, ignore_index=seq)) / 2
    return SpanOutput(start, end, loss)


def multiple_choice(state_dict: Mapping[str, torch.Tensor], config: BertConfig, pooled_output: torch.Tensor,
                    num_choices: int, labels: torch.Tensor | None = None, *, training: bool = False) -> HeadOutput:
    """``BertForMultipleChoice``'s head. Each choice is encoded on its own (inputs ``(batch, num_choices, seq)``
    flattened to ``(batch * num_choices, seq)``); one score per pooled vector (``classifier.*``, one output),
    reshaped to ``(batch, num_choices)``; the loss is a cross-entropy over the choices (labels ``(batch,)``).
    Defined in chapter 15."""
    require_head(state_dict, ("classifier.weight", "classifier.bias"), "BertForMultipleChoice")
    if pooled_output.shape[0] % num_choices:
        raise ValueError(f"multiple_choice got {pooled_output.shape[0]} pooled vectors, not a multiple of "
                         f"num_choices={num_choices}: flatten inputs (batch, num_choices, seq) to "
                         "(batch * num_choices, seq) before the encoder.")
    h = F.dropout(pooled_output, classifier_dropout_prob(config), training)
    logits = F.linear(h, state_dict["classifier.weight"], state_dict["classifier.bias"]).view(-1, num_choices)
    return HeadOutput(logits, _cross_entropy(logits, labels))


def state_dict_from_hf(model: nn.Module) -> dict[str, torch.Tensor]:
    """A ``transformers.BertFor*`` model's weights as one flat dict: the encoder part of
    :func:`bertlib.split_bert_state_dict` (``BertModel``'s names, buffers dropped) merged with the head's weights
    under their own names (``cls.*``, ``classifier.*``, ``qa_outputs.*``), less the tied MLM decoder (the word
    embeddings again, read from ``embeddings.word_embeddings.weight``)."""
    encoder_sd, head_sd = split_bert_state_dict(model.state_dict())
    return {**encoder_sd, **{k: v for k, v in head_sd.items() if not k.startswith("cls.predictions.decoder.")}}
