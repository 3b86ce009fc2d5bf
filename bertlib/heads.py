"""One encoder, many heads (chapter 15, *One encoder, many heads*): the task heads of Hugging Face's ``BertFor*``
classes as small functions on top of the encoder, with their losses, and BERT as a decoder (a causal mask).

Each head reads its weights from the same flat state dict as the encoder, under the names HF gives them without
the ``bert.`` prefix (``classifier.*``, ``qa_outputs.*``, ``cls.*``), so :func:`state_dict_from_hf` turns any
``BertFor*`` model into one dict that :func:`sequence_output` and the head read. The heads:

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

from .attention import extended_attention_mask
from .checks import check_config, check_inputs, expected_shapes
from .embeddings import embeddings
from .encoder import encoder
from .pretraining import IGNORE_INDEX, mlm_logits, nsp_logits


def check_no_cross_attention(config: BertConfig) -> None:
    """Refuse ``config.add_cross_attention=True``: bertlib has no cross-attention (a decoder layer's second attention
    block, whose keys and values come from an encoder's output), so such a config would silently run without it."""
    if getattr(config, "add_cross_attention", False):
        raise ValueError(
            "config.add_cross_attention=True asks for cross-attention (each layer also attends to an encoder's "
            "hidden states, as in an encoder-decoder), which bertlib does not implement: its weights "
            "(encoder.layer.*.crossattention.*) would be ignored. Use a config with add_cross_attention=False "
            "(an encoder, or a decoder with is_decoder=True), or transformers.EncoderDecoderModel for seq2seq."
        )


def causal_attention_mask(attention_mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``(batch, seq)`` 1/0 padding mask → additive ``(batch, 1, seq, seq)`` mask: 0 where query ``i`` may read key
    ``j`` (``j <= i`` and ``j`` is a real token), ``finfo(dtype).min`` elsewhere. The decoder's mask (HF's
    ``create_causal_mask`` for ``is_decoder=True``): the padding mask of :func:`bertlib.extended_attention_mask`
    combined with a lower-triangular matrix. Defined in chapter 15, *One encoder, many heads*.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (batch, seq), got {tuple(attention_mask.shape)}.")
    seq = attention_mask.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device).tril()  # (seq, seq): j <= i
    allowed = causal[None, None] & attention_mask.bool()[:, None, None, :]  # (batch, 1, seq, seq)
    return torch.zeros(allowed.shape, dtype=dtype, device=attention_mask.device).masked_fill(
        ~allowed, torch.finfo(dtype).min)


def _check_encoder_weights(state_dict: Mapping[str, torch.Tensor], config: BertConfig) -> None:
    """The embeddings' and every layer's weights are present with the shapes ``config`` implies (no pooler needed:
    ``BertForMaskedLM``, ``BertForTokenClassification``, ``BertForQuestionAnswering`` and ``BertLMHeadModel`` have
    none)."""
    wrong = [k for k, shape in expected_shapes(config).items() if not k.startswith("pooler.")
             and (k not in state_dict or tuple(state_dict[k].shape) != shape)]
    if wrong:
        raise ValueError(f"state_dict lacks or mis-shapes {len(wrong)} encoder weight(s), e.g. {wrong[:3]}. Pass "
                         "bertlib.heads.state_dict_from_hf(model) or a BertModel state dict matching the config.")


def sequence_output(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    *,
    is_decoder: bool | None = None,
    training: bool = False,
    attn_implementation: str = "eager",
) -> torch.Tensor:
    """The last hidden state ``(batch, seq, hidden)`` of embeddings → encoder, bidirectional (an encoder, BERT) or
    with the causal mask of :func:`causal_attention_mask` (a decoder: ``is_decoder``, by default
    ``config.is_decoder``). Inputs ``(batch, seq)``. Equals ``BertModel(config)(...).last_hidden_state``.
    Defined in chapter 15, *One encoder, many heads*.
    """
    check_config(config)
    check_no_cross_attention(config)
    _check_encoder_weights(state_dict, config)
    check_inputs(config, input_ids, attention_mask, token_type_ids)
    decoder = config.is_decoder if is_decoder is None else is_decoder
    x = embeddings(state_dict, config, input_ids, token_type_ids, training=training)
    if decoder:
        am = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        mask = causal_attention_mask(am, x.dtype)
    else:
        mask = None if attention_mask is None else extended_attention_mask(attention_mask, x.dtype)
    hidden, _ = encoder(state_dict, config, x, mask, training=training, attn_implementation=attn_implementation,
                        output_hidden_states=False, output_attentions=False)
    return hidden[-1]


def classifier_dropout_prob(config: BertConfig) -> float:
    """HF's rule for the dropout before a task head: ``classifier_dropout`` when set, else ``hidden_dropout_prob``."""
    p = getattr(config, "classifier_dropout", None)
    return config.hidden_dropout_prob if p is None else p


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


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    """Mean cross-entropy over the positions whose label is not ``-100`` (``None`` without labels)."""
    if labels is None:
        return None
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=IGNORE_INDEX)


def masked_lm(state_dict: Mapping[str, torch.Tensor], config: BertConfig, sequence_output: torch.Tensor,
              labels: torch.Tensor | None = None) -> HeadOutput:
    """``BertForMaskedLM``'s head: the MLM head of chapter 11 (transform, then the decoder tied to the word
    embeddings) on every token, ``(batch, seq, hidden)`` → ``(batch, seq, vocab)``; the loss is the cross-entropy
    over the positions whose label is not ``-100``. Defined in chapter 15, *One encoder, many heads*."""
    logits = mlm_logits(state_dict, config, sequence_output)
    return HeadOutput(logits, _cross_entropy(logits, labels))


def causal_lm(state_dict: Mapping[str, torch.Tensor], config: BertConfig, sequence_output: torch.Tensor,
              labels: torch.Tensor | None = None) -> HeadOutput:
    """``BertLMHeadModel``'s head: the same MLM head, read on a decoder's (causal) hidden states. Position ``t``
    predicts token ``t + 1``, so the loss compares ``logits[:, :-1]`` with ``labels[:, 1:]`` (labels are the input
    ids, ``-100`` where no loss is wanted). ``(batch, seq, hidden)`` → ``(batch, seq, vocab)``.
    Defined in chapter 15, *One encoder, many heads*."""
    logits = mlm_logits(state_dict, config, sequence_output)
    loss = None if labels is None else _cross_entropy(logits[:, :-1], labels[:, 1:])
    return HeadOutput(logits, loss)


def next_sentence(state_dict: Mapping[str, torch.Tensor], config: BertConfig, pooled_output: torch.Tensor,
                  labels: torch.Tensor | None = None) -> HeadOutput:
    """``BertForNextSentencePrediction``'s head: chapter 11's NSP layer on the pooled ``[CLS]`` vector,
    ``(batch, hidden)`` → ``(batch, 2)`` (0 = IsNext, 1 = NotNext). Defined in chapter 15."""
    logits = nsp_logits(state_dict, config, pooled_output)
    return HeadOutput(logits, _cross_entropy(logits, labels))


def token_classification(state_dict: Mapping[str, torch.Tensor], config: BertConfig, sequence_output: torch.Tensor,
                         labels: torch.Tensor | None = None, *, training: bool = False) -> HeadOutput:
    """``BertForTokenClassification``'s head: dropout, then one linear layer (``classifier.*``) on every token,
    ``(batch, seq, hidden)`` → ``(batch, seq, num_labels)``; labels ``(batch, seq)``, ``-100`` on positions
    without one (padding, special tokens, a word's later pieces). Defined in chapter 15."""
    h = F.dropout(sequence_output, classifier_dropout_prob(config), training)
    logits = F.linear(h, state_dict["classifier.weight"], state_dict["classifier.bias"])
    return HeadOutput(logits, _cross_entropy(logits, labels))


def question_answering(state_dict: Mapping[str, torch.Tensor], config: BertConfig, sequence_output: torch.Tensor,
                       start_positions: torch.Tensor | None = None,
                       end_positions: torch.Tensor | None = None) -> SpanOutput:
    """``BertForQuestionAnswering``'s head: a linear layer (``qa_outputs.*``, two outputs) on every token, split
    into start and end scores ``(batch, seq)``. The loss is the mean of the start and end cross-entropies over the
    sequence; positions outside ``[0, seq)`` are clamped to ``seq`` and ignored, as in HF. Defined in chapter 15."""
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
    h = F.dropout(pooled_output, classifier_dropout_prob(config), training)
    logits = F.linear(h, state_dict["classifier.weight"], state_dict["classifier.bias"]).view(-1, num_choices)
    return HeadOutput(logits, _cross_entropy(logits, labels))


def state_dict_from_hf(model: nn.Module) -> dict[str, torch.Tensor]:
    """A ``transformers.BertFor*`` model's weights as one flat dict: the encoder under ``BertModel``'s names (the
    ``bert.`` prefix dropped), the head under its own (``cls.*``, ``classifier.*``, ``qa_outputs.*``); the tied MLM
    decoder (the word embeddings again) and the ``position_ids`` buffer are left out."""
    out = {}
    for k, v in model.state_dict().items():
        if k.startswith("cls.predictions.decoder.") or k.endswith("position_ids"):
            continue
        out[k.removeprefix("bert.")] = v
    return out
