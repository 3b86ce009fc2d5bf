"""What pre-training reads (chapter 11, *Pre-training*): a word-level vocabulary as from-scratch tutorials build
one, BERT's masking rule (80/10/10), next-sentence pairs, a compact WordPiece vocabulary for a small model, the
tokenized pairs and the batches drawn from them. The model, its heads and the trainer are in
:mod:`bertlib.training.pretraining`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from bertlib.data.corpus import plain_sentence, sentences
from bertlib.model.runtime import IGNORE_INDEX

#: Special tokens of the word-level vocabulary, in the order a from-scratch tutorial gives them ids 0-4.
SPECIALS = ("<pad>", "<unk>", "<eos>", "<sos>", "<mask>")
#: NSP labels, HF's convention: 0 = segment B is the real continuation ("IsNext"), 1 = B is random ("NotNext").
IS_NEXT, NOT_NEXT = 0, 1


# ---- (1) a word-level vocabulary -----------------------------------------------------------------------------------


def simple_words(line: str) -> list[str]:
    """Lower-case words and single punctuation marks: ``"Hello, world!"`` → ``["hello", ",", "world", "!"]``."""
    return re.findall(r"[a-z0-9]+(?:'[a-z]+)?|[^\sa-z0-9]", line.lower())


def build_word_vocab(lines: Iterable[str], specials: Sequence[str] = SPECIALS) -> dict[str, int]:
    """A word-level vocabulary from a corpus: the special tokens first (ids ``0..len(specials)-1``), then every word
    of :func:`simple_words`, most frequent first (ties in order of first appearance).
    Defined in chapter 11, *Pre-training*.
    """
    counts = Counter(w for line in lines for w in simple_words(line))
    vocab = {tok: i for i, tok in enumerate(specials)}
    for word, _ in sorted(counts.items(), key=lambda kv: -kv[1]):  # sorted() is stable: ties keep first appearance
        vocab.setdefault(word, len(vocab))
    return vocab


def encode_words(line: str, vocab: Mapping[str, int], *, add_special_tokens: bool = True) -> list[int]:
    """``<sos> w1 w2 ... <eos>`` as ids; a word not in ``vocab`` becomes ``<unk>``."""
    ids = [vocab.get(w, vocab["<unk>"]) for w in simple_words(line)]
    return [vocab["<sos>"], *ids, vocab["<eos>"]] if add_special_tokens else ids


# ---- (2) masked language modelling: the 80/10/10 rule --------------------------------------------------------------


def mask_tokens(
    input_ids: torch.Tensor,
    special_tokens_mask: torch.Tensor,
    vocab_size: int,
    mask_token_id: int,
    mlm_probability: float = 0.15,
    generator: torch.Generator | None = None,
    *,
    attention_mask: torch.Tensor | None = None,
    fractions: tuple[float, float] = (0.8, 0.1),
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking rule. Each token that is neither special nor padding is *chosen* with probability
    ``mlm_probability``; ``fractions`` is ``(mask_fraction, random_fraction)``: a chosen token becomes ``[MASK]``
    with probability ``mask_fraction`` (0.8), a token drawn uniformly from ``[0, vocab_size)`` with probability
    ``random_fraction`` (0.1), and stays unchanged otherwise (0.1). Labels hold the original id at chosen positions
    and ``-100`` (ignored by the loss) everywhere else.

    ``input_ids``, ``special_tokens_mask`` (1 = special: never chosen), ``attention_mask`` (0 = padding: never
    chosen): ``(batch, seq)``. Random numbers come from ``generator`` (a CPU ``torch.Generator``), so a seed fixes
    the result. Returns ``(masked_input_ids, labels)``, both ``(batch, seq)``; the input is not modified.
    Like HF's ``DataCollatorForLanguageModeling``, each token is chosen independently (so the count per sequence
    varies); Google's original code chose ``min(max_predictions, max(1, round(0.15 n)))`` per sequence, ``n``
    counting every token of the pair. Defined in chapter 11, *Pre-training*.
    """
    mask_fraction, random_fraction = fractions
    if (not 0.0 <= mlm_probability <= 1.0 or mask_fraction < 0 or random_fraction < 0
            or mask_fraction + random_fraction > 1):
        raise ValueError("mlm_probability must lie in [0, 1] and fractions = (mask_fraction, random_fraction) "
                         "must be non-negative with mask_fraction + random_fraction in [0, 1].")
    if tuple(special_tokens_mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"special_tokens_mask has shape {tuple(special_tokens_mask.shape)}, input_ids "
                         f"{tuple(input_ids.shape)}: they must match "
                         "(tokenizer(..., return_special_tokens_mask=True)).")
    shape, dev = input_ids.shape, input_ids.device
    eligible = ~special_tokens_mask.bool()
    if attention_mask is not None:
        eligible &= attention_mask.bool()
    u_choose = torch.rand(shape, generator=generator).to(dev)
    u_kind = torch.rand(shape, generator=generator).to(dev)
    random_ids = torch.randint(vocab_size, shape, generator=generator).to(dev)
    chosen = eligible & (u_choose < mlm_probability)
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE_INDEX))
    to_mask = chosen & (u_kind < mask_fraction)
    to_random = chosen & (u_kind >= mask_fraction) & (u_kind < mask_fraction + random_fraction)
    masked = torch.where(to_mask, torch.full_like(input_ids, mask_token_id), input_ids)
    masked = torch.where(to_random, random_ids, masked)
    return masked, labels


# ---- (3) next-sentence prediction pairs ----------------------------------------------------------------------------


@dataclass
class NSPPair:
    """One NSP example: segments ``a`` and ``b`` and the label (0 = ``b`` follows ``a``, 1 = ``b`` is random)."""

    a: object
    b: object
    label: int


def _segment(sentences: Sequence[object]) -> object:
    """Consecutive sentences as one segment: strings joined by a space, token lists concatenated."""
    if all(isinstance(x, str) for x in sentences):
        return " ".join(sentences)  # type: ignore[arg-type]
    return [t for x in sentences for t in x]  # type: ignore[union-attr]


def nsp_pairs(sentences_by_doc: Sequence[Sequence[object]], rng: np.random.Generator,
              random_probability: float = 0.5, sentences_per_segment: int = 1) -> list[NSPPair]:
    """NSP examples from documents (lists of sentences). For every run of ``2k`` consecutive sentences of a document
    (``k = sentences_per_segment``), segment A is the first ``k``; with probability ``1 - random_probability``
    segment B is the next ``k`` (label 0, IsNext), otherwise ``k`` consecutive sentences of a *different* document
    drawn uniformly (label 1, NotNext). ``rng``: a ``numpy.random.Generator``.

    Sentences may be strings or token lists. BERT packs as many sentences into each segment as fit in 512 tokens;
    ``k > 1`` is a small step that way, and gives the model more words to compare. Defined in chapter 11,
    *Pre-training*.
    """
    k = int(sentences_per_segment)
    if k < 1:
        raise ValueError(f"sentences_per_segment must be at least 1, got {sentences_per_segment}.")
    docs = [list(d) for d in sentences_by_doc]
    others = [i for i, d in enumerate(docs) if len(d) >= k]
    if len(others) < 2:
        raise ValueError(f"nsp_pairs needs at least two documents with {k} or more sentences to draw random "
                         "segments from.")
    pairs = []
    for d, doc in enumerate(docs):
        for i in range(len(doc) - 2 * k + 1):
            a = _segment(doc[i:i + k])
            if rng.random() >= random_probability:
                pairs.append(NSPPair(a, _segment(doc[i + k:i + 2 * k]), IS_NEXT))
            else:
                j = d
                while j == d:
                    j = others[int(rng.integers(len(others)))]
                start = int(rng.integers(len(docs[j]) - k + 1))
                pairs.append(NSPPair(a, _segment(docs[j][start:start + k]), NOT_NEXT))
    return pairs


def split_sentences(text: str, min_words: int = 4, max_words: int = 40) -> list[str]:
    """The sentences of a post (whitespace normalised, split after ``.!?``, :func:`bertlib.data.corpus.sentences`) that
    read
    as prose: ``min_words`` to ``max_words`` words, plain ASCII, and no e-mail addresses, quoting marks or ASCII art
    (:func:`bertlib.data.corpus.plain_sentence`, the filter of the chapters' example sentences)."""
    return [s for s in sentences(text) if plain_sentence(s, min_words, max_words)]


def documents_from_posts(posts: Iterable[str], min_sentences: int = 2, **kwargs) -> list[list[str]]:
    """Posts → documents (lists of sentences, :func:`split_sentences`), keeping those with ``min_sentences``."""
    docs = (split_sentences(p, **kwargs) for p in posts)
    return [d for d in docs if len(d) >= min_sentences]


# ---- (4) the data of a small BERT trained from scratch -------------------------------------------------------------


@dataclass
class CompactVocab:
    """A smaller vocabulary: the ``size`` most frequent WordPiece ids of a corpus (special tokens first, ``[PAD]``
    at 0), so the tied decoder of a small model has ``size`` rows instead of the tokenizer's full vocabulary.
    ``new_to_old[i]`` is the tokenizer id of compact id ``i``; ``old_to_new`` maps every tokenizer id to its compact
    id, or to the compact ``[UNK]`` when it was not kept."""

    new_to_old: torch.Tensor
    old_to_new: torch.Tensor
    pad_id: int
    unk_id: int
    cls_id: int
    sep_id: int
    mask_id: int

    @property
    def size(self) -> int:
        return len(self.new_to_old)

    def encode(self, ids: torch.Tensor) -> torch.Tensor:
        return self.old_to_new.to(ids.device)[ids]

    def decode(self, ids: torch.Tensor) -> torch.Tensor:
        return self.new_to_old.to(ids.device)[ids]


def compact_vocab(token_ids: torch.Tensor, tokenizer: PreTrainedTokenizerBase, size: int) -> CompactVocab:
    """Keep ``[PAD] [UNK] [CLS] [SEP] [MASK]`` (compact ids 0-4) and the ``size - 5`` most frequent other ids among
    ``token_ids`` (tokenizer ids, any shape; ties broken by the smaller id). Defined in chapter 11b."""
    specials = [tokenizer.pad_token_id, tokenizer.unk_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id,
                tokenizer.mask_token_id]
    counts = torch.bincount(torch.as_tensor(token_ids).reshape(-1), minlength=len(tokenizer)).double()
    counts[specials] = -1.0
    order = counts.argsort(descending=True, stable=True)[: max(size - len(specials), 0)]
    order = order[counts[order] > 0]
    new_to_old = torch.cat([torch.tensor(specials), order]).long()
    old_to_new = torch.full((len(tokenizer),), 1, dtype=torch.long)  # not kept → compact [UNK] (id 1)
    old_to_new[new_to_old] = torch.arange(len(new_to_old))
    return CompactVocab(new_to_old, old_to_new, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4)


@dataclass
class PretrainingData:
    """Tokenized NSP pairs, ``(n, max_length)`` each, padded. ``special_tokens_mask`` marks ``[CLS]``, ``[SEP]``,
    ``[PAD]`` and ``[UNK]``: positions never chosen for MLM. ``vocab_size`` and ``mask_token_id`` are those of
    the ids' vocabulary (the tokenizer's, or a :class:`CompactVocab` after :meth:`remap`)."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    attention_mask: torch.Tensor
    special_tokens_mask: torch.Tensor
    next_sentence_label: torch.Tensor
    vocab_size: int
    mask_token_id: int

    def __len__(self) -> int:
        return len(self.input_ids)

    def remap(self, vocab: CompactVocab) -> PretrainingData:
        """The same data with ids in ``vocab``; tokens it does not keep become ``[UNK]`` (and are never masked)."""
        ids = vocab.encode(self.input_ids)
        special = self.special_tokens_mask.bool() | (ids == vocab.unk_id)
        return PretrainingData(ids, self.token_type_ids, self.attention_mask, special.long(), self.next_sentence_label,
                               vocab.size, vocab.mask_id)

    def subset(self, index: torch.Tensor | slice) -> PretrainingData:
        """The rows ``index``."""
        return PretrainingData(self.input_ids[index], self.token_type_ids[index], self.attention_mask[index],
                               self.special_tokens_mask[index], self.next_sentence_label[index], self.vocab_size,
                               self.mask_token_id)


def tokenize_pairs(pairs: Sequence[NSPPair], tokenizer: PreTrainedTokenizerBase, max_length: int) -> PretrainingData:
    """``[CLS] A [SEP] B [SEP]`` for every pair, truncated (longest segment first) to ``max_length`` and padded to
    it, with ``token_type_ids`` 0 on ``[CLS] A [SEP]`` and 1 on ``B [SEP]``. Defined in chapter 11b."""
    enc = tokenizer([p.a for p in pairs], [p.b for p in pairs], truncation="longest_first", max_length=max_length,
                    padding="max_length", return_special_tokens_mask=True, return_tensors="pt")
    ids = enc["input_ids"]
    special = enc["special_tokens_mask"].bool() | (ids == tokenizer.unk_token_id) | ~enc["attention_mask"].bool()
    return PretrainingData(ids, enc["token_type_ids"], enc["attention_mask"], special.long(),
                           torch.tensor([p.label for p in pairs]), len(tokenizer), tokenizer.mask_token_id)


def sample_batch(data: PretrainingData, batch_size: int, generator: torch.Generator,
                 mlm_probability: float = 0.15, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """One training batch: ``batch_size`` pairs drawn at random (with replacement) by ``generator``, cut to the
    longest row, and masked afresh with :func:`mask_tokens` (*dynamic* masking: a pair gets new masks each time it
    is drawn). Returns :func:`bert_for_pretraining`'s keyword arguments: ``input_ids`` (masked),
    ``attention_mask``, ``token_type_ids``, ``labels`` (``(batch, seq)`` each) and ``next_sentence_label``
    ``(batch,)``, on ``device``. Defined in chapter 11b."""
    idx = torch.randint(len(data), (batch_size,), generator=generator)
    am = data.attention_mask[idx]
    width = int(am.sum(1).max())
    ids, am = data.input_ids[idx, :width], am[:, :width]
    masked, labels = mask_tokens(ids, data.special_tokens_mask[idx, :width], data.vocab_size, data.mask_token_id,
                                 mlm_probability, generator=generator)
    batch = dict(input_ids=masked, attention_mask=am, token_type_ids=data.token_type_ids[idx, :width],
                 labels=labels, next_sentence_label=data.next_sentence_label[idx])
    return {k: v.to(device) for k, v in batch.items()}
