"""bertlib.tasks.heads (chapter 15): every task head and its loss against the transformers class holding the same
weights,
on the encoder output of ``bertlib.bert_forward`` (causal for ``BertLMHeadModel``). The causal mask itself and the
refusal of cross-attention are tested with the encoder, in test_hf_semantics.py."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForMultipleChoice,
    BertForNextSentencePrediction,
    BertForQuestionAnswering,
    BertForTokenClassification,
    BertLMHeadModel,
)

import bertlib
from bertlib.tasks import heads as H
from helpers import random_inputs

F32 = bertlib.tolerance("cpu", torch.float32)


def small_config(**overrides) -> BertConfig:
    fields = dict(vocab_size=97, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=80,
                  max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu", num_labels=5)
    fields.update(overrides)
    config = BertConfig(**fields)
    config._attn_implementation = "eager"
    return config


def hf_model(cls, seed: int = 0, **overrides):
    """A random ``cls`` in eval mode whose every parameter (biases and LayerNorms too) is perturbed away from HF's
    initialisation, so a head that forgot a bias or read the wrong tensor cannot match by luck."""
    torch.manual_seed(seed)
    model = cls(small_config(**overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model, H.state_dict_from_hf(model)


def real(batch: dict) -> torch.Tensor:
    return batch["attention_mask"].bool()


def sequence_output(sd: dict, config: BertConfig, **batch) -> torch.Tensor:
    """HF's ``sequence_output``: the encoder's last hidden state (causal when ``config.is_decoder``), no pooler."""
    return bertlib.bert_forward(sd, config, **batch, add_pooling_layer=False).last_hidden_state


def test_masked_lm_against_hf():
    model, sd = hf_model(BertForMaskedLM)
    batch = random_inputs(model.config, 3, 11, seed=1)
    labels = torch.where(torch.rand(3, 11, generator=torch.Generator().manual_seed(2)) < 0.3, batch["input_ids"],
                         torch.full_like(batch["input_ids"], -100)).masked_fill(~real(batch), -100)
    with torch.no_grad():
        theirs = model(**batch, labels=labels)
        ours = H.masked_lm(sd, model.config, sequence_output(sd, model.config, **batch), labels)
    assert_close(ours.logits[real(batch)], theirs.logits[real(batch)], **F32)
    assert_close(ours.loss, theirs.loss, **F32)


def test_causal_lm_against_hf_and_shifted_loss():
    model, sd = hf_model(BertLMHeadModel, is_decoder=True)
    batch = random_inputs(model.config, 3, 12, seed=3)
    labels = batch["input_ids"].masked_fill(~real(batch), -100)
    with torch.no_grad():
        theirs = model(**batch, labels=labels, use_cache=False)
        ours = H.causal_lm(sd, model.config, sequence_output(sd, model.config, **batch), labels)
    assert_close(ours.logits[real(batch)], theirs.logits[real(batch)], **F32)
    assert_close(ours.loss, theirs.loss, **F32)
    # the shift by hand: position t predicts token t + 1
    by_hand = torch.nn.functional.cross_entropy(ours.logits[:, :-1].reshape(-1, 97), labels[:, 1:].reshape(-1))
    assert_close(ours.loss, by_hand, **F32)


def test_decoder_hides_the_future_encoder_does_not():
    model, sd = hf_model(BertLMHeadModel, is_decoder=True)
    encoder_config = small_config(is_decoder=False)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(4))
    changed = ids.clone()
    changed[:, -1] = (ids[:, -1] + 1) % 97
    with torch.no_grad():
        a, b = (sequence_output(sd, model.config, input_ids=x) for x in (ids, changed))
        enc_a, enc_b = (sequence_output(sd, encoder_config, input_ids=x) for x in (ids, changed))
    assert_close(a[:, :-1], b[:, :-1], atol=0, rtol=0)  # a later token changes no earlier vector
    assert (enc_a[:, :-1] - enc_b[:, :-1]).abs().max() > 1e-3


def test_next_sentence_against_hf():
    model, sd = hf_model(BertForNextSentencePrediction)
    batch = random_inputs(model.config, 4, 10, seed=5)
    labels = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        theirs = model(**batch, labels=labels)
        out = bertlib.bert_forward(sd, model.config, **batch)
        ours = H.next_sentence(sd, model.config, out.pooler_output, labels)
    assert_close(ours.logits, theirs.logits, **F32)
    assert_close(ours.loss, theirs.loss, **F32)


def test_token_classification_against_hf_and_dropout():
    model, sd = hf_model(BertForTokenClassification)
    batch = random_inputs(model.config, 3, 10, seed=6)
    labels = torch.randint(0, 5, (3, 10), generator=torch.Generator().manual_seed(7)).masked_fill(~real(batch), -100)
    with torch.no_grad():
        theirs = model(**batch, labels=labels)
        seq_out = sequence_output(sd, model.config, **batch)
        ours = H.token_classification(sd, model.config, seq_out, labels)
        dropped = H.token_classification(sd, model.config, seq_out, training=True)
    assert ours.logits.shape == (3, 10, 5)
    assert_close(ours.logits[real(batch)], theirs.logits[real(batch)], **F32)
    assert_close(ours.loss, theirs.loss, **F32)
    assert (dropped.logits - ours.logits).abs().max() > 1e-3  # dropout (p = 0.1) is active in training


def test_question_answering_against_hf_with_out_of_range_positions():
    model, sd = hf_model(BertForQuestionAnswering, num_labels=2)
    batch = random_inputs(model.config, 3, 10, seed=8)
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])  # compare every position
    start, end = torch.tensor([1, 4, 25]), torch.tensor([3, 4, 30])  # the last example's span lies outside: ignored
    with torch.no_grad():
        theirs = model(**batch, start_positions=start, end_positions=end)
        ours = H.question_answering(sd, model.config, sequence_output(sd, model.config, **batch), start, end)
    assert_close(ours.start_logits, theirs.start_logits, **F32)
    assert_close(ours.end_logits, theirs.end_logits, **F32)
    assert_close(ours.loss, theirs.loss, **F32)


def test_multiple_choice_against_hf():
    model, sd = hf_model(BertForMultipleChoice)
    flat = random_inputs(model.config, 6, 9, seed=9)  # 2 questions x 3 choices
    batch = {k: v.view(2, 3, 9) for k, v in flat.items()}
    labels = torch.tensor([2, 0])
    with torch.no_grad():
        theirs = model(**batch, labels=labels)
        pooled = bertlib.bert_forward(sd, model.config, **{k: v.view(-1, 9) for k, v in batch.items()}).pooler_output
        ours = H.multiple_choice(sd, model.config, pooled, 3, labels)
    assert ours.logits.shape == (2, 3)
    assert_close(ours.logits, theirs.logits, **F32)
    assert_close(ours.loss, theirs.loss, **F32)


def test_state_dict_from_hf_drops_the_prefix_and_the_tied_decoder():
    model, sd = hf_model(BertForMaskedLM)
    assert "embeddings.word_embeddings.weight" in sd and "cls.predictions.bias" in sd
    assert not any(k.startswith(("bert.", "cls.predictions.decoder")) or "position_ids" in k for k in sd)


def test_a_missing_head_or_a_wrong_choice_count_is_refused_with_the_fix():
    model, sd = hf_model(BertForTokenClassification)
    h = torch.zeros(2, 5, 48)
    encoder_only = {k: v for k, v in sd.items() if not k.startswith("classifier.")}
    with pytest.raises(ValueError, match=r"classifier\.weight.*state_dict_from_hf"):
        H.token_classification(encoder_only, model.config, h)
    with pytest.raises(ValueError, match="cls.predictions"):
        H.masked_lm(encoder_only, model.config, h)
    with pytest.raises(ValueError, match="num_choices=3"):
        H.multiple_choice(sd, model.config, torch.zeros(4, 48), 3)
