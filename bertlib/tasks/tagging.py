"""Token classification scored like named-entity recognition (chapter 15b, *Question answering and tagging, trained*).

The labels come from rules, stated here and in the chapter, applied to 20 Newsgroups lines:

| type | rule (a regular expression, in this order; a later match overlapping an earlier one is dropped) |
| --- | --- |
| ``MSGID`` | a message id: what stands between ``<`` and ``>`` right after ``article`` (``In article <...> ...
writes:``), which looks like an e-mail address |
| ``EMAIL`` | ``name@host.domain``: letters, digits and ``._%+-`` before ``@``, dotted host parts after it |
| ``GROUP`` | a newsgroup name: a top-level hierarchy (``alt``, ``comp``, ``misc``, ``news``, ``rec``, ``sci``,
``soc``, ``talk``), then one or more lower-case ``.part`` s |
| ``QTY`` | a number followed by a unit (``MB``, ``MHz``, ``mph``, ``lbs``, ``cc``, ...), see :data:`UNITS` |

A word is the tokenizer's word (its pre-tokenizer splits at spaces and punctuation, so ``jdoe@cs.edu`` is five
words). Words wholly inside an entity get ``B-TYPE`` (the first) or ``I-TYPE``; the others ``O``. The model sees one
label per word on the word's first sub-token; its other sub-tokens and the special tokens get ``-100``.
There is no URL type: web addresses are rare in these 1993 posts.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable, Sequence

from bertlib.model.runtime import IGNORE_INDEX

#: Units after a number that make a quantity (case-sensitive; one optional space between number and unit).
UNITS = ("KB", "MB", "GB", "TB", "Kb", "Mb", "kb", "meg", "megs", "MHz", "GHz", "kHz", "Hz", "mph", "km", "kg",
         "lb", "lbs", "cc", "mm", "cm", "ft", "hp", "ns", "ms", "dpi", "bps", "baud", "bits", "bytes", "miles", "feet",
         "inches", "V", "W", "K", "M")
_HIERARCHIES = ("alt", "comp", "misc", "news", "rec", "sci", "soc", "talk")
RULES = (
    ("MSGID", re.compile(r"(?<=[Aa]rticle <)[^<>\s]+@[^<>\s]+(?=>)")),
    ("EMAIL", re.compile(r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")),
    ("GROUP", re.compile(r"\b(?:" + "|".join(_HIERARCHIES) + r")(?:\.[a-z0-9+_-]+)+\b")),
    ("QTY", re.compile(r"\b\d+(?:[.,]\d+)? ?(?:" + "|".join(UNITS) + r")\b")),
)
#: Entity types in label order.
TYPES = tuple(t for t, _ in RULES)
#: The BIO labels: ``O``, then ``B-`` and ``I-`` of every type.
LABELS = ("O", *(f"{bi}-{t}" for t in TYPES for bi in "BI"))


def find_entities(text: str) -> list[tuple[int, int, str]]:
    """Character spans ``(start, end, type)`` of the rules' matches in ``text``, sorted by start; a match that
    overlaps one of an earlier rule is dropped. Defined in chapter 15b."""
    found: list[tuple[int, int, str]] = []
    for kind, pattern in RULES:
        for m in pattern.finditer(text):
            if all(m.end() <= s or m.start() >= e for s, e, _ in found):
                found.append((m.start(), m.end(), kind))
    return sorted(found)


def word_spans(word_ids: Sequence[int | None], offsets: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Character span of every word of one tokenized text, from its ``word_ids()`` and ``offset_mapping``
    ``(seq, 2)``: from the word's first token's start to its last token's end, words in order.
    Defined in chapter 15b."""
    spans: dict[int, list[int]] = {}
    for token, word in enumerate(word_ids):
        if word is not None:
            start, end = (int(x) for x in offsets[token])
            spans.setdefault(word, [start, end])[1] = end
    return [(spans[w][0], spans[w][1]) for w in sorted(spans)]


def bio_word_labels(words: Sequence[tuple[int, int]], entities: Sequence[tuple[int, int, str]]) -> list[str]:
    """One BIO tag per word: ``B-TYPE`` for the first word wholly inside an entity, ``I-TYPE`` for the next ones,
    ``O`` elsewhere (a word only partly inside an entity is ``O``). Defined in chapter 15b."""
    tags = []
    for start, end in words:
        tag = "O"
        for s, e, kind in entities:
            if s <= start and end <= e:
                tag = f"{'I' if tags and tags[-1][2:] == kind and tags[-1] != 'O' and start > s else 'B'}-{kind}"
                break
        tags.append(tag)
    return tags


def align_labels_with_tokens(word_ids: Sequence[int | None], word_label_ids: Sequence[int]) -> list[int]:
    """Token labels ``(seq,)`` from word labels: each word's label on its first sub-token, ``-100`` (ignored by
    the loss) on its other sub-tokens and on special tokens and padding (``word_ids`` ``None``).
    Defined in chapter 15b."""
    labels, previous = [], None
    for word in word_ids:
        labels.append(IGNORE_INDEX if word is None or word == previous else int(word_label_ids[word]))
        previous = word
    return labels


def entity_chunks(tags: Sequence[str], words: Sequence[tuple[int, int]]) -> list[tuple[str, int, int]]:
    """Entities ``(type, start_char, end_char)`` from one BIO tag per word, read like conlleval (and seqeval's
    default mode, and the token-classification pipeline): ``B-X`` starts an entity, ``I-X`` continues an ``X``
    or, after anything else, starts one. Defined in chapter 15b."""
    chunks: list[list] = []
    prev = "O"
    for tag, (start, end) in zip(tags, words, strict=True):
        if tag == "O":
            prev = tag
            continue
        bi, kind = tag.split("-", 1)
        if bi == "I" and prev != "O" and prev[2:] == kind:
            chunks[-1][2] = end
        else:
            chunks.append([kind, start, end])
        prev = tag
    return [tuple(c) for c in chunks]


def per_word_baseline(train_words: Sequence[Sequence[str]],
                      train_tags: Sequence[Sequence[str]]) -> Callable[[Sequence[str]], list[str]]:
    """The per-word baseline: a function from a list of words to their tags, each word's most frequent tag in
    training (lower-cased), ``O`` for a word never seen. Defined in chapter 15b."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for words, tags in zip(train_words, train_tags, strict=True):
        for word, tag in zip(words, tags, strict=True):
            counts[word.lower()][tag] += 1
    best = {w: c.most_common(1)[0][0] for w, c in counts.items()}

    def predict(words: Sequence[str]) -> list[str]:
        return [best.get(w.lower(), "O") for w in words]

    return predict


def entity_scores(true_tags: Sequence[Sequence[str]], pred_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """Entity-level ``precision``, ``recall`` and ``f1`` (micro-averaged over entities; an entity counts only when
    its type and both ends are right) with ``seqeval``, and ``f1_<TYPE>`` per type. Defined in chapter 15b."""
    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

    true_tags, pred_tags = [list(t) for t in true_tags], [list(p) for p in pred_tags]
    report = classification_report(true_tags, pred_tags, output_dict=True, zero_division=0)
    scores = {"precision": precision_score(true_tags, pred_tags, zero_division=0),
              "recall": recall_score(true_tags, pred_tags, zero_division=0),
              "f1": f1_score(true_tags, pred_tags, zero_division=0)}
    scores.update({f"f1_{t}": report[t]["f1-score"] for t in TYPES if t in report})
    return {k: float(v) for k, v in scores.items()}
