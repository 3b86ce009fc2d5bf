"""bertlib.tasks.span_tasks (chapter 15b): QA examples with exact offsets, windows, span labels, post-processing,
scores.

Synthetic posts only (no 20 Newsgroups data needed); the default model's tokenizer."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer

import bertlib
from bertlib.tasks import span_tasks as st

POST = ("From: jdoe@cs.example.edu (Jane Doe)\nSubject: Re: clocks\nLines: 9\n\n"
        "In article <x1@foo.org> bob@foo.org (Bob Roe) writes:\n> Jane Doe said so.\n"
        "I think the clock runs at 25 MHz.\n\n--\nJane Doe\njdoe@cs.example.edu\n")


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(bertlib.default_model_path())


def test_parse_from_both_forms():
    assert st.parse_from("From: jdoe@cs.example.edu (Jane Doe)") == ("Jane Doe", "jdoe@cs.example.edu")
    assert st.parse_from('From: "Jane Q. Doe" <jq@x.org>\nSubject: y') == ("Jane Q. Doe", "jq@x.org")
    assert st.parse_from("From: jdoe@x.org (jd)") == (None, "jdoe@x.org")  # one word is not a name
    assert st.parse_from("Subject: nothing") == (None, None)


def test_examples_have_exact_offsets_and_no_header():
    examples = st.make_qa_examples([POST])
    assert [e["kind"] for e in examples] == ["name", "email"]
    for e in examples:
        start, text = e["answers"]["answer_start"][0], e["answers"]["text"][0]
        assert e["context"][start:start + len(text)] == text
        assert "From:" not in e["context"]
    name = examples[0]
    assert name["answers"]["answer_start"][0] == name["context"].rindex("Jane Doe")  # the signature, not the quote
    assert st.last_unquoted("> Jane Doe\nx", "Jane Doe") == -1


def test_tail_keeps_the_last_lines():
    examples = st.make_qa_examples([POST], tail_lines=2)
    assert examples[0]["context"] == "Jane Doe\njdoe@cs.example.edu"
    assert st.tail("a\n\n b \nc\n", None) == "a\n b\nc"


def test_rule_baseline():
    context = st.make_qa_examples([POST])[0]["context"]
    assert st.rule_answer("email", context) == "jdoe@cs.example.edu"
    assert st.rule_answer("name", context) == "Jane Doe"
    assert st.rule_answer("name", "no name here") == ""


def test_windows_stride_and_labels(tokenizer):
    examples = st.make_qa_examples([POST])
    enc = st.prepare_windows(tokenizer, [e["question"] for e in examples], [e["context"] for e in examples],
                             max_length=24, stride=6)
    assert enc["input_ids"].shape[1] == 24 and len(enc["input_ids"]) > 2
    starts, ends = st.span_labels(enc, examples)
    for w, n in enumerate(enc["overflow_to_sample_mapping"].tolist()):
        text = examples[n]["answers"]["text"][0]
        if starts[w] > 0:  # the answer is inside this window: its characters are exactly the answer
            offsets = enc["offset_mapping"][w]
            assert examples[n]["context"][int(offsets[starts[w]][0]):int(offsets[ends[w]][1])] == text
            assert enc["context_mask"][w, starts[w]] and enc["context_mask"][w, ends[w]]
    for n in range(len(examples)):  # every answer lies wholly inside some window
        assert any(starts[w] > 0 for w, m in enumerate(enc["overflow_to_sample_mapping"].tolist()) if m == n)
    # consecutive windows of one context share `stride` context tokens
    first = [w for w, m in enumerate(enc["overflow_to_sample_mapping"].tolist()) if m == 0][:2]
    ids = [enc["input_ids"][w][enc["context_mask"][w]].tolist() for w in first]
    assert ids[0][-6:] == ids[1][:6]


def test_char_to_token_span_outside_is_cls():
    offsets = [(0, 0), (0, 3), (0, 0), (0, 4), (5, 9), (10, 12), (0, 0)]
    mask = [False, False, False, True, True, True, False]
    assert st.char_to_token_span(offsets, mask, 5, 12) == (4, 5)
    assert st.char_to_token_span(offsets, mask, 6, 8) == (4, 4)  # inside one token
    assert st.char_to_token_span(offsets, mask, 5, 20) == (0, 0)  # runs past the window


def test_best_span_brute_force():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        s, e = torch.randn(12, generator=g), torch.randn(12, generator=g)
        mask = torch.rand(12, generator=g) > 0.3
        score, i, j = st.best_span(s, e, mask, 4)
        pairs = [(float(s[a] + e[b]), a, b) for a in range(12) for b in range(a, min(12, a + 4)) if mask[a] and mask[b]]
        if not pairs:
            assert score == float("-inf")
            continue
        best = max(pairs)
        assert (i, j) == best[1:] and score == pytest.approx(best[0])


def test_postprocess_maps_back_to_characters(tokenizer):
    examples = st.make_qa_examples([POST])
    enc = st.prepare_windows(tokenizer, [e["question"] for e in examples], [e["context"] for e in examples], 24, 6)
    starts, ends = st.span_labels(enc, examples)
    seq = enc["input_ids"].shape[1]
    start_logits = torch.nn.functional.one_hot(starts, seq).float() * 10  # a perfect model, [CLS] excluded
    end_logits = torch.nn.functional.one_hot(ends, seq).float() * 10
    answers = st.postprocess_qa_predictions(examples, enc, start_logits, end_logits)
    assert answers == [e["answers"]["text"][0] for e in examples]


def test_squad_scores():
    assert st.normalize_answer("The  Jane, Doe!") == "jane doe"
    assert st.f1_score("Jane Doe", "Jane X. Doe") == pytest.approx(2 * 1 * (2 / 3) / (1 + 2 / 3))
    scores = st.squad_scores(["jane doe", "", "x"], ["Jane Doe", "", "y"])
    assert scores == {"exact_match": pytest.approx(2 / 3), "f1": pytest.approx(2 / 3)}
