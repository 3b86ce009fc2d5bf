"""Extractive question answering on 20 Newsgroups (chapter 15b, *Question answering and tagging, trained*).

The questions are built from the posts themselves, with exact character offsets: the ``From:`` header names the
author and gives an e-mail address; the answer is where that name (or address) occurs again in the post's body,
usually in the signature. The context is the body only, headers removed: with the ``From:`` line kept, every
answer would sit right after ``From:`` and a one-line rule would find it.

The rest is the standard machinery of Hugging Face's question-answering examples, written small:
windows over long contexts with a stride (:func:`prepare_windows`), character offsets to token positions
(:func:`char_to_token_span`), the best span with start <= end and a length limit (:func:`best_span`) mapped back
to characters (:func:`postprocess_qa_predictions`), and SQuAD's exact match and F1 (:func:`squad_scores`).
"""

from __future__ import annotations

import collections
import re
import string
from collections.abc import Sequence

import torch
from transformers import PreTrainedTokenizerBase

#: The two questions, keyed by what they ask for.
QUESTIONS = {"name": "Who wrote this?", "email": "What is the author's e-mail address?"}

EMAIL = re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")
_FROM = re.compile(r"^From:[ \t]*(.*)$", re.M)
_NAME_IN_PARENS = re.compile(r"\(([^()]+)\)")
_NAME_BEFORE_ADDR = re.compile(r'^"?([^"<]+?)"?\s*<')
_NAME_LINE = re.compile(r"^[A-Z][a-z'-]+(?: [A-Z]\.)?(?: [A-Z][A-Za-z'-]+){1,2}$")


def split_post(post: str) -> tuple[str, str, int]:
    """``(header, body, body_start)``: a post's header block (up to the first blank line), its body, and the body's
    first character in ``post``. Defined in chapter 15b."""
    header, sep, body = post.partition("\n\n")
    return header, body, len(header) + len(sep)


def parse_from(header: str) -> tuple[str | None, str | None]:
    """The author's ``(name, email)`` from a ``From:`` header line, ``None`` where absent. Handles
    ``addr (Name)`` and ``Name <addr>``; a name needs two words or more. Defined in chapter 15b."""
    m = _FROM.search(header)
    if not m:
        return None, None
    value = m.group(1).strip()
    mail = EMAIL.search(value)
    named = _NAME_IN_PARENS.search(value) or _NAME_BEFORE_ADDR.search(value)
    name = named.group(1).strip() if named else None
    if name is not None and (len(name.split()) < 2 or "@" in name):
        name = None
    return name, mail.group(0) if mail else None


def last_unquoted(body: str, needle: str) -> int:
    """Character offset of ``needle``'s last occurrence in ``body`` on a line not quoted with ``>`` or ``|``,
    ``-1`` if none. Defined in chapter 15b."""
    pos = body.rfind(needle)
    while pos >= 0:
        line_start = body.rfind("\n", 0, pos) + 1
        if not body[line_start:pos + 1].lstrip().startswith((">", "|")):
            return pos
        pos = body.rfind(needle, 0, pos)
    return -1


def tail(body: str, lines: int | None) -> str:
    """The last ``lines`` lines of ``body`` (blank lines and trailing white space dropped first; all of it for
    ``None``): the end of a post, where a signature sits. Defined in chapter 15b."""
    kept = [line.rstrip() for line in body.splitlines() if line.strip()]
    return "\n".join(kept if lines is None else kept[-lines:])


def make_qa_examples(posts: Sequence[str], post_ids: Sequence[int] | None = None,
                     tail_lines: int | None = None) -> list[dict]:
    """SQuAD-style examples: for every post and question whose answer occurs in the context, ``dict(id, post,
    kind, question, context, answers=dict(text=[...], answer_start=[...]))`` with ``context[answer_start :
    answer_start + len(text)] == text`` exactly. The context is the body, headers removed, cut to its last
    ``tail_lines`` non-blank lines (:func:`tail`). Defined in chapter 15b."""
    examples = []
    for n, post in enumerate(posts):
        header, body, _ = split_post(post)
        body = tail(body, tail_lines)
        name, mail = parse_from(header)
        for kind, answer in (("name", name), ("email", mail)):
            if not answer:
                continue
            start = last_unquoted(body, answer)
            if start < 0:
                continue
            pid = n if post_ids is None else int(post_ids[n])
            examples.append(dict(id=f"{pid}-{kind}", post=pid, kind=kind, question=QUESTIONS[kind], context=body,
                                 answers=dict(text=[answer], answer_start=[start])))
    return examples


def rule_answer(kind: str, context: str) -> str:
    """The rule baseline. ``"email"``: the last e-mail address in the context. ``"name"``: the last line that
    looks like a name (two or three capitalised words, an optional initial). ``""`` when nothing matches.
    Defined in chapter 15b."""
    if kind == "email":
        found = EMAIL.findall(context)
        return found[-1] if found else ""
    names = [line.strip() for line in context.splitlines() if _NAME_LINE.match(line.strip())]
    return names[-1] if names else ""


def prepare_windows(tokenizer: PreTrainedTokenizerBase, questions: Sequence[str], contexts: Sequence[str],
                    max_length: int, stride: int) -> dict:
    """``[CLS] question [SEP] context-window [SEP]`` for every window of every context: the tokenizer's
    ``truncation="only_second"`` with ``return_overflowing_tokens``, consecutive windows sharing ``stride``
    tokens. Returns the encoding (``input_ids`` etc. ``(windows, max_length)``, padded), its
    ``overflow_to_sample_mapping`` ``(windows,)``, ``offset_mapping`` and ``context_mask`` ``(windows,
    max_length)`` (True on the context's tokens). Defined in chapter 15b."""
    enc = tokenizer(list(questions), list(contexts), truncation="only_second", max_length=max_length,
                    stride=stride, return_overflowing_tokens=True, return_offsets_mapping=True,
                    padding="max_length", return_tensors="pt")
    enc["context_mask"] = torch.tensor([[s == 1 for s in enc.sequence_ids(w)] for w in range(len(enc["input_ids"]))])
    return enc


def char_to_token_span(offsets: Sequence[Sequence[int]], context_mask: Sequence[bool], start_char: int,
                       end_char: int) -> tuple[int, int]:
    """Token positions ``(start, end)`` (inclusive) of the characters ``[start_char, end_char)`` in one window,
    from its ``offset_mapping`` ``(seq, 2)`` and ``context_mask`` ``(seq,)``; ``(0, 0)`` (the ``[CLS]``
    position) when the answer is not wholly inside the window, as Hugging Face's examples label it.
    Defined in chapter 15b."""
    ctx = [i for i, inside in enumerate(context_mask) if inside]
    if not ctx or offsets[ctx[0]][0] > start_char or offsets[ctx[-1]][1] < end_char:
        return 0, 0
    start = next(i for i in ctx if offsets[i][1] > start_char)
    end = next(i for i in reversed(ctx) if offsets[i][0] < end_char)
    return start, end


def span_labels(enc: dict, examples: Sequence[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """``start_positions`` and ``end_positions`` ``(windows,)`` for :func:`prepare_windows`' windows of
    ``examples`` (each window's example is ``overflow_to_sample_mapping``). Defined in chapter 15b."""
    starts, ends = [], []
    for w, n in enumerate(enc["overflow_to_sample_mapping"].tolist()):
        ans = examples[n]["answers"]
        first = ans["answer_start"][0]
        s, e = char_to_token_span(enc["offset_mapping"][w].tolist(), enc["context_mask"][w].tolist(), first,
                                  first + len(ans["text"][0]))
        starts.append(s)
        ends.append(e)
    return torch.tensor(starts), torch.tensor(ends)


def best_span(start_logits: torch.Tensor, end_logits: torch.Tensor, context_mask: torch.Tensor,
              max_answer_length: int) -> tuple[float, int, int]:
    """The best answer in one window: ``(score, i, j)`` maximising ``start_logits[i] + end_logits[j]``
    (``(seq,)`` each) over context tokens with ``i <= j < i + max_answer_length``. Every pair is scored (a
    ``(seq, seq)`` table), not only the top ``n_best`` starts and ends. Defined in chapter 15b."""
    seq = start_logits.shape[0]
    scores = start_logits[:, None] + end_logits[None, :]  # (seq, seq): start i, end j
    i, j = torch.arange(seq)[:, None], torch.arange(seq)[None, :]
    ok = (j >= i) & (j < i + max_answer_length) & context_mask[:, None] & context_mask[None, :]
    if not ok.any():
        return float("-inf"), 0, 0
    flat = int(scores.masked_fill(~ok, float("-inf")).argmax())
    return float(scores.flatten()[flat]), flat // seq, flat % seq


def postprocess_qa_predictions(examples: Sequence[dict], enc: dict, start_logits: torch.Tensor,
                               end_logits: torch.Tensor, max_answer_length: int = 30) -> list[str]:
    """Each example's answer text: the best :func:`best_span` over all its windows (logits ``(windows, seq)``),
    mapped back to characters with ``offset_mapping``: ``context[offsets[i][0] : offsets[j][1]]``.
    Defined in chapter 15b."""
    best: dict[int, tuple[float, int, int, int]] = {}
    for w, n in enumerate(enc["overflow_to_sample_mapping"].tolist()):
        score, i, j = best_span(start_logits[w].float().cpu(), end_logits[w].float().cpu(),
                                enc["context_mask"][w], max_answer_length)
        if n not in best or score > best[n][0]:
            best[n] = (score, w, i, j)
    answers = []
    for n, ex in enumerate(examples):
        if n not in best or best[n][0] == float("-inf"):
            answers.append("")
            continue
        _, w, i, j = best[n]
        offsets = enc["offset_mapping"][w]
        answers.append(ex["context"][int(offsets[i][0]):int(offsets[j][1])])
    return answers


def normalize_answer(text: str) -> str:
    """SQuAD's normalisation: lower case, no punctuation, no articles (a, an, the), single spaces.
    Defined in chapter 15b."""
    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def f1_score(prediction: str, truth: str) -> float:
    """SQuAD's token F1 between two answers after :func:`normalize_answer`: the harmonic mean of the shared
    words' precision and recall. Defined in chapter 15b."""
    pred, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((collections.Counter(pred) & collections.Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


def squad_scores(predictions: Sequence[str], truths: Sequence[str]) -> dict[str, float]:
    """Mean ``exact_match`` (normalised strings equal) and ``f1`` over the examples, as fractions in [0, 1].
    Defined in chapter 15b."""
    em = [float(normalize_answer(p) == normalize_answer(t)) for p, t in zip(predictions, truths, strict=True)]
    f1 = [f1_score(p, t) for p, t in zip(predictions, truths, strict=True)]
    return {"exact_match": sum(em) / len(em), "f1": sum(f1) / len(f1)}
