"""bertlib.tasks.tagging (chapter 15b): rule labels, BIO tags per word, first-sub-token alignment, chunks, seqeval
scores.

Synthetic text only; the default model's tokenizer."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

import bertlib
from bertlib.tasks import tagging as tg

TEXT = "In article <a1@x.org> jdoe@cs.example.edu writes: see http://www.x.org/y, post to sci.space, 33 MHz 8MB."


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(bertlib.default_model_path())


def test_rules():
    found = [(TEXT[s:e], kind) for s, e, kind in tg.find_entities(TEXT)]
    assert found == [("a1@x.org", "MSGID"), ("jdoe@cs.example.edu", "EMAIL"), ("sci.space", "GROUP"),
                     ("33 MHz", "QTY"), ("8MB", "QTY")]
    assert tg.find_entities("in 1993 we had 3 cats") == []
    assert tg.LABELS[0] == "O" and len(tg.LABELS) == 1 + 2 * len(tg.TYPES)


def test_words_tags_and_alignment(tokenizer):
    enc = tokenizer(TEXT, return_offsets_mapping=True)
    words = tg.word_spans(enc.word_ids(), enc["offset_mapping"])
    assert len(words) == max(w for w in enc.word_ids() if w is not None) + 1
    tags = tg.bio_word_labels(words, tg.find_entities(TEXT))
    email = [(TEXT[s:e], t) for (s, e), t in zip(words, tags, strict=True) if t.endswith("EMAIL")]
    assert [w for w, _ in email] == ["jdoe", "@", "cs", ".", "example", ".", "edu"]
    assert [t for _, t in email] == ["B-EMAIL"] + ["I-EMAIL"] * 6
    ids = [tg.LABELS.index(t) for t in tags]
    labels = tg.align_labels_with_tokens(enc.word_ids(), ids)
    assert labels[0] == labels[-1] == -100  # [CLS], [SEP]
    firsts = [i for i, w in enumerate(enc.word_ids()) if w is not None and (i == 0 or enc.word_ids()[i - 1] != w)]
    assert [labels[i] for i in firsts] == ids
    assert all(labels[i] == -100 for i in range(len(labels)) if i not in firsts)
    # the chunks read back are the rules' entities, snapped to words
    chunks = tg.entity_chunks(tags, words)
    assert [(k, TEXT[s:e]) for k, s, e in chunks] == [(k, TEXT[s:e]) for s, e, k in tg.find_entities(TEXT)]


def test_chunks_match_seqeval():
    from seqeval.metrics.sequence_labeling import get_entities

    tags = ["O", "I-QTY", "I-QTY", "B-QTY", "B-MSGID", "I-EMAIL", "O", "B-GROUP", "I-GROUP", "I-MSGID"]
    words = [(i, i + 1) for i in range(len(tags))]
    ours = [(k, s, e - 1) for k, s, e in tg.entity_chunks(tags, words)]
    assert ours == get_entities(tags)


def test_baseline_and_scores():
    predict = tg.per_word_baseline([["a", "@", "b"], ["@", "x"]], [["B-EMAIL", "I-EMAIL", "I-EMAIL"], ["O", "O"]])
    assert predict(["A", "@", "zzz"]) == ["B-EMAIL", "I-EMAIL", "O"]
    true = [["B-EMAIL", "I-EMAIL", "O", "B-QTY"]]
    scores = tg.entity_scores(true, [["B-EMAIL", "O", "O", "B-QTY"]])
    assert scores["precision"] == scores["recall"] == scores["f1"] == pytest.approx(0.5)
    assert scores["f1_QTY"] == 1.0 and scores["f1_EMAIL"] == 0.0
    assert tg.entity_scores(true, true)["f1"] == 1.0
