"""bertlib.training.pretraining (chapter 11): vocabulary, masking statistics, NSP pairs, position encoding, the heads
and loss against transformers.BertForPreTraining, and a short training run."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import transformers
from torch.testing import assert_close
from transformers import BertConfig, BertForPreTraining

import bertlib
import bertlib.training.optimization
from bertlib.data import pretraining_data
from bertlib.model import runtime
from bertlib.tasks import heads
from bertlib.training import pretraining as P
from helpers import random_inputs, random_model

F32 = bertlib.tolerance("cpu", torch.float32)  # these models run on the CPU
F64 = bertlib.tolerance("cpu", torch.float64)


# ---- (1) word-level vocabulary ------------------------------------------------------------------------------------

def test_word_vocab():
    lines = ["The cat sat on the mat.", "The dog sat, too!"]
    vocab = pretraining_data.build_word_vocab(lines)
    assert list(vocab)[:5] == list(pretraining_data.SPECIALS) and list(vocab.values()) == list(range(len(vocab)))
    assert list(vocab)[5:8] == ["the", "sat", "cat"]  # by frequency (3, 2, 1...), ties in order of first appearance
    ids = pretraining_data.encode_words("The bird sat.", vocab)
    assert ids[0] == vocab["<sos>"] and ids[-1] == vocab["<eos>"]
    assert ids[1:-1] == [vocab["the"], vocab["<unk>"], vocab["sat"], vocab["."]]
    assert pretraining_data.simple_words("Don't panic, it's fine!") == ["don't", "panic", ",", "it's", "fine", "!"]


# ---- (2) masking ----------------------------------------------------------------------------------------------------

def test_mask_tokens_proportions():
    """200,000 tokens, 10% of them special or padding. Each observed proportion must lie within 4 standard errors
    (sqrt(p(1-p)/n)) of its expected value: a false alarm has probability about 6e-5 per check."""
    g = torch.Generator().manual_seed(0)
    vocab_size, mask_id = 30000, 3
    ids = torch.randint(10, vocab_size, (1000, 200), generator=g)
    special = torch.zeros_like(ids)
    special[:, 0] = special[:, -1] = 1
    attention = torch.ones_like(ids)
    attention[:, -18:] = 0  # padding: 18 per row
    ids[:, -18:] = 0
    masked, labels = pretraining_data.mask_tokens(ids, special, vocab_size, mask_id, 0.15, generator=g,
                                                  attention_mask=attention)
    eligible = (special == 0) & (attention == 1)
    chosen = labels != runtime.IGNORE_INDEX
    n_eligible, n_chosen = int(eligible.sum()), int(chosen.sum())

    def within(observed: float, p: float, n: int) -> None:
        se = math.sqrt(p * (1 - p) / n)
        assert abs(observed - p) < 4 * se, f"observed {observed:.4f}, expected {p:.4f} +- {4 * se:.4f}"

    within(n_chosen / n_eligible, 0.15, n_eligible)
    is_mask = masked[chosen] == mask_id
    unchanged = masked[chosen] == ids[chosen]
    within(is_mask.float().mean().item(), 0.8, n_chosen)
    # a random draw equals the original (or [MASK]) with probability 1/vocab_size: 3e-6, far below the tolerance
    within(unchanged.float().mean().item(), 0.1 + 0.1 / vocab_size, n_chosen)
    within((~is_mask & ~unchanged).float().mean().item(), 0.1 * (1 - 2 / vocab_size), n_chosen)
    # never special, never padding; labels exactly at chosen positions; the rest untouched
    assert not chosen[~eligible].any()
    assert torch.equal(labels[chosen], ids[chosen])
    assert torch.equal(masked[~chosen], ids[~chosen])
    assert (labels[~chosen] == runtime.IGNORE_INDEX).all()


def test_mask_tokens_special_padding_and_seed(pretrained):
    tok = pretrained.tokenizer
    enc = tok(["a short one", "a somewhat longer sentence than the first one here"], padding=True,
              return_special_tokens_mask=True, return_tensors="pt")
    ids, special = enc["input_ids"], enc["special_tokens_mask"]
    assert special[enc["attention_mask"] == 0].all()  # the tokenizer marks padding as special too
    for seed in range(20):
        masked, labels = pretraining_data.mask_tokens(ids, special, len(tok), tok.mask_token_id, 0.5,
                                       generator=torch.Generator().manual_seed(seed))
        assert (labels[special.bool()] == runtime.IGNORE_INDEX).all()
        assert torch.equal(masked[special.bool()], ids[special.bool()])
    a, b = (pretraining_data.mask_tokens(ids, special, len(tok), tok.mask_token_id,
                                         generator=torch.Generator().manual_seed(7)) for _ in range(2))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    everything = pretraining_data.mask_tokens(ids, special, len(tok), tok.mask_token_id, 1.0, fractions=(1.0, 0.0))
    assert torch.equal(everything[0][~special.bool()], torch.full_like(ids[~special.bool()], tok.mask_token_id))
    with pytest.raises(ValueError, match="mask_fraction"):
        pretraining_data.mask_tokens(ids, special, len(tok), tok.mask_token_id, fractions=(0.95, 0.1))
    with pytest.raises(ValueError, match="must match"):
        pretraining_data.mask_tokens(ids, special[:, :-1], len(tok), tok.mask_token_id)


# ---- (3) NSP pairs ----------------------------------------------------------------------------------------------

def test_nsp_pairs():
    docs = [[f"d{d}s{i}" for i in range(n)] for d, n in enumerate([30, 1, 25, 40, 0, 35])]
    owner = {s: d for d, doc in enumerate(docs) for s in doc}
    pairs = pretraining_data.nsp_pairs(docs, np.random.default_rng(0))
    assert len(pairs) == sum(max(len(d) - 1, 0) for d in docs)
    for p in pairs:
        da, ia = owner[p.a], docs[owner[p.a]].index(p.a)
        if p.label == pretraining_data.IS_NEXT:
            assert p.b == docs[da][ia + 1]
        else:
            assert p.label == pretraining_data.NOT_NEXT and owner[p.b] != da
    frac = np.mean([p.label for p in pairs])
    assert abs(frac - 0.5) < 4 * math.sqrt(0.25 / len(pairs))
    again = pretraining_data.nsp_pairs(docs, np.random.default_rng(0))
    assert [(p.a, p.b, p.label) for p in again] == [(p.a, p.b, p.label) for p in pairs]
    with pytest.raises(ValueError, match="at least two documents with 1 or more sentences"):
        pretraining_data.nsp_pairs([["a", "b"], []], np.random.default_rng(0))


def test_nsp_pairs_of_several_sentences():
    """k sentences per segment: A is k consecutive sentences, B the next k (IsNext) or k consecutive sentences of
    another document (NotNext); strings are joined with a space, token lists concatenated."""
    docs = [[f"d{d}s{i}" for i in range(n)] for d, n in enumerate([30, 1, 25, 40, 3, 35])]
    k = 2
    pairs = pretraining_data.nsp_pairs(docs, np.random.default_rng(0), sentences_per_segment=k)
    assert len(pairs) == sum(max(len(d) - 2 * k + 1, 0) for d in docs)
    for p in pairs:
        a, b = p.a.split(" "), p.b.split(" ")
        assert len(a) == len(b) == k
        da, ia = int(a[0][1:a[0].index("s")]), docs[int(a[0][1:a[0].index("s")])].index(a[0])
        assert a == docs[da][ia:ia + k]
        db, ib = int(b[0][1:b[0].index("s")]), None
        ib = docs[db].index(b[0])
        assert b == docs[db][ib:ib + k]                        # k consecutive sentences of one document
        assert (db == da and ib == ia + k) if p.label == pretraining_data.IS_NEXT else db != da
    tokens = pretraining_data.nsp_pairs([[[1, 2], [3], [4, 5], [6]], [[7], [8], [9]]], np.random.default_rng(1), 0.0, 2)
    assert [(p.a, p.b, p.label) for p in tokens] == [([1, 2, 3], [4, 5, 6], pretraining_data.IS_NEXT)]
    with pytest.raises(ValueError, match="sentences_per_segment must be at least 1"):
        pretraining_data.nsp_pairs(docs, np.random.default_rng(0), sentences_per_segment=0)


def test_tokenize_pairs_segments(pretrained):
    tok = pretrained.tokenizer
    pairs = [pretraining_data.NSPPair("the first segment.", "and the second one.", 0),
             pretraining_data.NSPPair("short.", "also short.", 1)]
    data = pretraining_data.tokenize_pairs(pairs, tok, max_length=16)
    assert data.input_ids.shape == (2, 16) and data.next_sentence_label.tolist() == [0, 1]
    row = data.input_ids[0][data.attention_mask[0].bool()]
    seps = (row == tok.sep_token_id).nonzero().flatten().tolist()
    types = data.token_type_ids[0][data.attention_mask[0].bool()]
    assert row[0] == tok.cls_token_id and len(seps) == 2 and seps[1] == len(row) - 1
    assert (types[: seps[0] + 1] == 0).all() and (types[seps[0] + 1:] == 1).all()
    assert data.special_tokens_mask[0][[0, seps[0], seps[1]]].all()
    vocab = pretraining_data.compact_vocab(data.input_ids[data.attention_mask.bool()], tok, 12)
    small = data.remap(vocab)
    assert small.vocab_size == vocab.size <= 12 and small.mask_token_id == vocab.mask_id
    kept = small.input_ids != vocab.unk_id
    assert torch.equal(vocab.decode(small.input_ids)[kept], data.input_ids[kept])
    assert small.special_tokens_mask[~kept].all()


# ---- (4) sinusoidal position encoding ---------------------------------------------------------------------------

def test_sinusoidal_position_encoding():
    pe = P.sinusoidal_position_encoding(50, 16, dtype=torch.float64)
    for pos in (0, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert math.isclose(pe[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-12)
            assert math.isclose(pe[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-12)
    dots = pe @ pe.T  # depends only on the offset: sum_i cos(w_i (p - q))
    for k in (1, 5, 20):
        assert_close(torch.diagonal(dots, k), torch.full((50 - k,), dots[0, k].item(), dtype=torch.float64), **F64)
    assert_close(torch.diagonal(dots), torch.full((50,), 8.0, dtype=torch.float64), **F64)
    with pytest.raises(ValueError, match="even"):
        P.sinusoidal_position_encoding(10, 7)


# ---- (5) heads and loss against transformers.BertForPreTraining ---------------------------------------------------

def hf_pretraining_twin(sd: dict, config: BertConfig, seed: int, dtype=torch.float64):
    """BertForPreTraining with ``sd`` as its encoder and seeded random heads; returns (model, our state dict)."""
    config = copy.deepcopy(config)
    config._attn_implementation = "eager"
    transformers.logging.set_verbosity_error()
    model = BertForPreTraining(config).to(dtype).eval()
    model.bert.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.cls.named_parameters():  # the tied decoder weight is not listed (it is the embeddings)
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(dtype) * 0.2
                    + ("LayerNorm.weight" in name))
    ours = {k[len("bert."):] if k.startswith("bert.") else k: v for k, v in model.state_dict().items()}
    return model, ours


def test_tied_decoder_in_hf():
    sd, config, _ = random_model(seed=0, dtype=torch.float64)
    model, _ = hf_pretraining_twin(sd, config, seed=1)
    assert model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert model.cls.predictions.decoder.bias is model.cls.predictions.bias


@pytest.mark.parametrize("overrides", [dict(), dict(hidden_act="gelu_new", num_attention_heads=2, num_hidden_layers=1)],
                         ids=["gelu", "gelu_new"])
def test_heads_and_loss_equal_hf_random_model(overrides):
    sd, config, _ = random_model(seed=2, dtype=torch.float64, **overrides)
    model, ours_sd = hf_pretraining_twin(sd, config, seed=3)
    batch = random_inputs(config, batch=4, seq=13, seed=5)
    masked, labels = pretraining_data.mask_tokens(batch["input_ids"], 1 - batch["attention_mask"], config.vocab_size,
                                                  1, 0.3, generator=torch.Generator().manual_seed(0))
    batch["input_ids"] = masked
    nsl = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        ref = model(**batch, labels=labels, next_sentence_label=nsl)
    ours = P.bert_for_pretraining(ours_sd, config, **batch, labels=labels, next_sentence_label=nsl)
    real = batch["attention_mask"].bool()
    assert_close(ours.prediction_logits[real], ref.prediction_logits[real], **F64)
    assert_close(ours.seq_relationship_logits, ref.seq_relationship_logits, **F64)
    assert_close(ours.loss, ref.loss, **F64)
    assert_close(ours.mlm_loss + ours.nsp_loss, ours.loss, **F64)
    only = P.bert_for_pretraining(ours_sd, config, **batch, labels=labels, next_sentence_label=nsl, masked_only=True)
    assert only.prediction_logits.shape == (int((labels != -100).sum()), config.vocab_size)
    assert_close(only.loss, ref.loss, **F64)


def test_heads_and_loss_equal_hf_embedded_model(pretrained, real_batch):
    sd, config = pretrained.state_dict, pretrained.config
    model, ours_sd = hf_pretraining_twin({k: v.cpu() for k, v in sd.items()}, config, seed=4, dtype=torch.float32)
    batch = {k: v.cpu() for k, v in real_batch.items()}
    masked, labels = pretraining_data.mask_tokens(batch["input_ids"], 1 - batch["attention_mask"], config.vocab_size,
                                   pretrained.tokenizer.mask_token_id, generator=torch.Generator().manual_seed(1),
                                   attention_mask=batch["attention_mask"])
    labels[0, 1] = batch["input_ids"][0, 1]  # at least one label
    batch["input_ids"] = masked
    nsl = torch.tensor([0, 1, 0])
    with torch.no_grad():
        ref = model(**batch, labels=labels, next_sentence_label=nsl)
    ours = P.bert_for_pretraining(ours_sd, config, **batch, labels=labels, next_sentence_label=nsl)
    real = batch["attention_mask"].bool()
    assert_close(ours.prediction_logits[real], ref.prediction_logits[real], atol=1e-4, rtol=0.0)  # logits ~ 1e2
    assert_close(ours.seq_relationship_logits, ref.seq_relationship_logits, **F32)
    assert_close(ours.loss, ref.loss, atol=1e-4, rtol=1e-5)


def test_init_state_dict():
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=20, pad_token_id=0)
    sd = P.init_state_dict(config, seed=0)
    bertlib.check_state_dict(sd, config)
    assert set(sd) == set(bertlib.expected_shapes(config)) | set(heads.pretraining_head_shapes(config))
    assert (sd["embeddings.word_embeddings.weight"][0] == 0).all()
    assert (sd["encoder.layer.0.output.LayerNorm.weight"] == 1).all() and (sd["cls.predictions.bias"] == 0).all()
    std = sd["encoder.layer.1.intermediate.dense.weight"].std().item()
    assert abs(std - config.initializer_range) < 0.1 * config.initializer_range
    assert torch.equal(P.init_state_dict(config, seed=0)["pooler.dense.weight"], sd["pooler.dense.weight"])


# ---- (6) training -------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_training_reduces_both_losses_and_exports_to_hf():
    """A tiny model on a synthetic task with structure in both objectives: segment A counts up from a random start
    (ids 5-22, modulo 18); an IsNext segment B keeps counting, a NotNext B is random ids from 23-39. A masked id is
    predictable from its neighbours, and B's ids tell NotNext apart. 80 steps must lower both losses clearly."""
    g = torch.Generator().manual_seed(0)
    vocab, n, half = 40, 512, 6
    start = torch.randint(18, (n, 1), generator=g)
    a = (start + torch.arange(half)) % 18 + 5
    label = torch.randint(2, (n,), generator=g)
    b = torch.where(label[:, None] == 0, (start + half + torch.arange(half)) % 18 + 5,
                    torch.randint(23, vocab, (n, half), generator=g))
    cls, sep = torch.full((n, 1), 2), torch.full((n, 1), 3)
    ids = torch.cat([cls, a, sep, b, sep], 1)
    types = torch.cat([torch.zeros(n, half + 2), torch.ones(n, half + 1)], 1).long()
    special = (ids == 2) | (ids == 3)
    data = pretraining_data.PretrainingData(ids, types, torch.ones_like(ids), special.long(), label, vocab, 4)
    config = BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=ids.shape[1], pad_token_id=0)
    torch.manual_seed(0)
    model = P.BertPretrainingModel(P.init_state_dict(config, seed=0), config)
    before = P.evaluate(model, data)
    hist = P.pretrain(model, data, steps=80, recipe=P.PretrainRecipe(batch_size=32, lr=3e-3), seed=0)
    after = P.evaluate(model, data)
    assert len(hist.mlm) == 80 and hist.lr[0] < hist.lr[10] and hist.lr[-1] < hist.lr[10]
    assert after["mlm_loss"] < before["mlm_loss"] - 0.3, (before, after)
    assert after["nsp_loss"] < before["nsp_loss"] - 0.05, (before, after)
    assert np.mean(hist.total[-10:]) < np.mean(hist.total[:10])
    # the trained weights load into transformers.BertForPreTraining and give the same outputs
    keys = set(model.state_dict())
    config._attn_implementation = "eager"
    hf = BertForPreTraining(config).eval()
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    assert keys == set(hf.state_dict()) - {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
    with torch.no_grad():
        ours = model(ids[:8], None, types[:8])
        ref = hf(input_ids=ids[:8], token_type_ids=types[:8])
    assert_close(ours.prediction_logits, ref.prediction_logits, **F32)
    assert_close(ours.seq_relationship_logits, ref.seq_relationship_logits, **F32)


def test_train_step_is_the_step_written_out():
    """sample_batch + train_step = a batch masked by hand, forward, MLM + NSP loss, backward, clip, AdamW (HF's
    decay rule), schedule step; and pretrain's first steps are exactly these."""
    g = torch.Generator().manual_seed(1)
    n, vocab = 64, 40
    ids = torch.cat([torch.full((n, 1), 2), torch.randint(5, vocab, (n, 10), generator=g), torch.full((n, 1), 3)], 1)
    special = ((ids == 2) | (ids == 3)).long()
    data = pretraining_data.PretrainingData(ids, torch.zeros_like(ids), torch.ones_like(ids), special,
                             torch.randint(2, (n,), generator=g), vocab, 4)
    config = BertConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=12, pad_token_id=0, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
    lib = P.BertPretrainingModel(P.init_state_dict(config, seed=0), config).train()
    by_hand, via_pretrain = copy.deepcopy(lib), copy.deepcopy(lib)
    batch = pretraining_data.sample_batch(data, 16, torch.Generator().manual_seed(7))
    opt = bertlib.training.optimization.adamw(lib, 1e-2, 0.01, eps=P.PRETRAIN_ADAM_EPS)
    sched = bertlib.training.optimization.schedule(opt, 4, 0.0)
    out = P.train_step(lib, batch, opt, sched)

    decay = [p for name, p in by_hand.named_parameters() if not (name.endswith("bias") or "LayerNorm" in name)]
    rest = [p for name, p in by_hand.named_parameters() if name.endswith("bias") or "LayerNorm" in name]
    adam = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}],
                             lr=1e-2, eps=1e-6)
    mine = P.bert_for_pretraining(by_hand.weights(), config, **batch, training=True, attn_implementation="sdpa")
    assert_close(mine.loss, out.loss, **F32)
    mine.loss.backward()
    torch.nn.utils.clip_grad_norm_(by_hand.parameters(), 1.0)
    adam.step()
    for (name, a), b in zip(by_hand.state_dict().items(), lib.state_dict().values(), strict=True):
        assert_close(b, a, atol=1e-6, rtol=0, msg=name)
    assert sched.get_last_lr() == [1e-2 * 3 / 4] * 2  # two groups: decay and no decay

    hist = P.pretrain(via_pretrain, data, steps=1, recipe=P.PretrainRecipe(batch_size=16, lr=1e-2, warmup=0.0),
                      seed=7)
    for (name, a), b in zip(lib.state_dict().items(), via_pretrain.state_dict().values(), strict=True):
        assert_close(b, a, atol=1e-6, rtol=0, msg=name)
    assert hist.lr == [1e-2] and hist.total == [out.loss.item()]
