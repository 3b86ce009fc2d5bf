"""Pre-training BERT: masked language modelling and next-sentence prediction (chapter 11, *Pre-training*).

Devlin et al. (2019) pre-train BERT with two objectives at once: predict 15% of the input tokens that were hidden
(MLM), and predict whether segment B followed segment A in the text (NSP). This module has the pieces, named as in
Hugging Face's ``BertForPreTraining``: a word-level vocabulary as from-scratch tutorials build one, the masking
rule, NSP pair construction, the sinusoidal position encoding of Vaswani et al. (2017) for contrast with BERT's
learned table, the two heads and their summed loss, and a small trainer built on :func:`bertlib.bert_forward`.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig, PreTrainedTokenizerBase

from .checks import check_config, expected_shapes
from .classifier import _module_tree
from .encoder import bert_forward
from .layer import activation
from .layer_norm import layer_norm
from .optimization import adamw, optimizer_step, schedule
from .runtime import resolve_seed

#: Special tokens of the word-level vocabulary, in the order a from-scratch tutorial gives them ids 0-4.
SPECIALS = ("<pad>", "<unk>", "<eos>", "<sos>", "<mask>")
#: The label value cross-entropy ignores (PyTorch's ``ignore_index`` default, HF's convention).
IGNORE_INDEX = -100
#: NSP labels, HF's convention: 0 = segment B is the real continuation ("IsNext"), 1 = B is random ("NotNext").
IS_NEXT, NOT_NEXT = 0, 1


# ---- (1) a word-level vocabulary ----------------------------------------------------------------------------------


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


# ---- (2) masked language modelling: the 80/10/10 rule -------------------------------------------------------------


def mask_tokens(
    input_ids: torch.Tensor,
    special_tokens_mask: torch.Tensor,
    vocab_size: int,
    mask_token_id: int,
    mlm_probability: float = 0.15,
    generator: torch.Generator | None = None,
    *,
    attention_mask: torch.Tensor | None = None,
    mask_fraction: float = 0.8,
    random_fraction: float = 0.1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's masking rule. Each token that is neither special nor padding is *chosen* with probability
    ``mlm_probability``; a chosen token becomes ``[MASK]`` with probability ``mask_fraction`` (0.8), a token drawn
    uniformly from ``[0, vocab_size)`` with probability ``random_fraction`` (0.1), and stays unchanged otherwise
    (0.1). Labels hold the original id at chosen positions and ``-100`` (ignored by the loss) everywhere else.

    ``input_ids``, ``special_tokens_mask`` (1 = special: never chosen), ``attention_mask`` (0 = padding: never
    chosen): ``(batch, seq)``. Random numbers come from ``generator`` (a CPU ``torch.Generator``), so a seed fixes
    the result. Returns ``(masked_input_ids, labels)``, both ``(batch, seq)``; the input is not modified.
    Like HF's ``DataCollatorForLanguageModeling``, each token is chosen independently (so the count per sequence
    varies); the original code chose exactly ``round(0.15 n)`` per sequence. Defined in chapter 11, *Pre-training*.
    """
    if (not 0.0 <= mlm_probability <= 1.0 or mask_fraction < 0 or random_fraction < 0
            or mask_fraction + random_fraction > 1):
        raise ValueError("mlm_probability must lie in [0, 1] and mask_fraction + random_fraction in [0, 1].")
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


# ---- (3) next-sentence prediction pairs ---------------------------------------------------------------------------


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
    """The sentences of a post (whitespace normalised, split after ``.!?``) with ``min_words`` to ``max_words``
    words, plain ASCII, and no e-mail addresses, quoting marks or ASCII art."""
    text = " ".join(text.split())
    out = []
    for s in re.split(r"(?<=[.!?])\s+", text):
        n = len(s.split())
        if min_words <= n <= max_words and s.isascii() and not re.search(r"[@<>|#*=_~^\\]", s):
            out.append(s)
    return out


def documents_from_posts(posts: Iterable[str], min_sentences: int = 2, **kwargs) -> list[list[str]]:
    """Posts → documents (lists of sentences, :func:`split_sentences`), keeping those with ``min_sentences``."""
    docs = (split_sentences(p, **kwargs) for p in posts)
    return [d for d in docs if len(d) >= min_sentences]


# ---- (4) sinusoidal position encoding -----------------------------------------------------------------------------


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


# ---- (5) the pre-training heads and the loss ----------------------------------------------------------------------


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


def init_state_dict(config: BertConfig, seed: int | None = None, *, heads: bool = True,
                    dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """A freshly initialised BERT (and, with ``heads``, its pre-training heads), HF's way: every weight matrix and
    embedding table normal with standard deviation ``config.initializer_range``, biases 0, LayerNorm weight 1 and
    bias 0, and the ``[PAD]`` row (``config.pad_token_id``) of the word embeddings 0. Keys as in ``BertModel``
    plus ``cls.*``. Defined in chapter 11, *Pre-training*.
    """
    check_config(config)
    g = torch.Generator().manual_seed(resolve_seed(seed))
    shapes = {**expected_shapes(config), **(pretraining_head_shapes(config) if heads else {})}
    sd = {}
    for name, shape in shapes.items():
        if "LayerNorm.weight" in name:
            t = torch.ones(shape, dtype=torch.float64)
        elif name.endswith("bias"):
            t = torch.zeros(shape, dtype=torch.float64)
        else:
            t = torch.randn(shape, generator=g, dtype=torch.float64) * config.initializer_range
        sd[name] = t.to(dtype)
    pad = getattr(config, "pad_token_id", None)
    if pad is not None:
        sd["embeddings.word_embeddings.weight"][pad] = 0
    return sd


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
    Defined in chapter 11, *Pre-training* (HF ``BertLMPredictionHead``).
    """
    h = mlm_transform(state_dict, config, sequence_output)
    return F.linear(h, state_dict["embeddings.word_embeddings.weight"], state_dict["cls.predictions.bias"])


def nsp_logits(state_dict: Mapping[str, torch.Tensor], config: BertConfig, pooled_output: torch.Tensor) -> torch.Tensor:
    """The NSP head: one linear layer on the pooled ``[CLS]`` vector, ``(batch, hidden)`` → ``(batch, 2)``
    (column 0 = IsNext, 1 = NotNext). Defined in chapter 11, *Pre-training* (HF ``cls.seq_relationship``)."""
    return F.linear(pooled_output, state_dict["cls.seq_relationship.weight"], state_dict["cls.seq_relationship.bias"])


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


def bert_for_pretraining(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    next_sentence_label: torch.Tensor | None = None,
    *,
    training: bool = False,
    attn_implementation: str = "eager",
    masked_only: bool = False,
) -> PreTrainingOutput:
    """BERT + both pre-training heads: equals ``transformers.BertForPreTraining`` given the same weights.

    ``state_dict``: ``BertModel`` keys plus ``cls.*`` (:func:`pretraining_head_shapes`). Inputs ``(batch, seq)``.
    ``prediction_logits``: ``(batch, seq, vocab)``, or with ``masked_only`` only the rows where ``labels != -100``,
    ``(n_masked, vocab)``: the loss is the same, and it saves computing the vocabulary-sized product for the 85% of
    positions that have no label. ``seq_relationship_logits``: ``(batch, 2)``. With ``labels`` and
    ``next_sentence_label`` also the losses. Defined in chapter 11, *Pre-training*.
    """
    out = bert_forward(state_dict, config, input_ids, attention_mask, token_type_ids, training=training,
                       attn_implementation=attn_implementation)
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


# ---- (6) training a small BERT from scratch -----------------------------------------------------------------------


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
    ``token_ids`` (tokenizer ids, any shape; ties broken by the smaller id). Defined in chapter 11, *Pre-training*."""
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
    it, with ``token_type_ids`` 0 on ``[CLS] A [SEP]`` and 1 on ``B [SEP]``. Defined in chapter 11, *Pre-training*."""
    enc = tokenizer([p.a for p in pairs], [p.b for p in pairs], truncation="longest_first", max_length=max_length,
                    padding="max_length", return_special_tokens_mask=True, return_tensors="pt")
    ids = enc["input_ids"]
    special = enc["special_tokens_mask"].bool() | (ids == tokenizer.unk_token_id) | ~enc["attention_mask"].bool()
    return PretrainingData(ids, enc["token_type_ids"], enc["attention_mask"], special.long(),
                           torch.tensor([p.label for p in pairs]), len(tokenizer), tokenizer.mask_token_id)


class BertPretrainingModel(nn.Module):
    """A trainable BERT with both pre-training heads, computed by :func:`bert_for_pretraining`.

    Its ``state_dict()`` uses ``transformers.BertForPreTraining``'s names (``bert.*``, ``cls.*``; the tied decoder
    weight and bias are the same tensors as ``bert.embeddings.word_embeddings.weight`` and ``cls.predictions.bias``
    and are not stored twice), so it loads into HF with ``strict=False``.
    Defined in chapter 11, *Pre-training*.
    """

    def __init__(self, state_dict: Mapping[str, torch.Tensor], config: BertConfig, *,
                 attn_implementation: str = "sdpa") -> None:
        super().__init__()
        check_config(config)
        self.config = config
        self.attn_implementation = attn_implementation
        self.bert = _module_tree({k: v for k, v in state_dict.items() if k in expected_shapes(config)})
        self.cls = _module_tree({k[len("cls."):]: v for k, v in state_dict.items()
                                 if k in pretraining_head_shapes(config)})

    def weights(self) -> dict[str, torch.Tensor]:
        """The parameters under ``bert_for_pretraining``'s names (``BertModel`` keys and ``cls.*``)."""
        return {**dict(self.bert.named_parameters()), **{"cls." + k: v for k, v in self.cls.named_parameters()}}

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, labels=None, next_sentence_label=None,
                *, masked_only: bool = False) -> PreTrainingOutput:
        return bert_for_pretraining(self.weights(), self.config, input_ids, attention_mask, token_type_ids, labels,
                                    next_sentence_label, training=self.training,
                                    attn_implementation=self.attn_implementation, masked_only=masked_only)


@dataclass
class TrainingHistory:
    """Per-step losses (``mlm``, ``nsp``, ``total``) and learning rates, and the wall time of :func:`pretrain`."""

    mlm: list[float] = field(default_factory=list)
    nsp: list[float] = field(default_factory=list)
    total: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    seconds: float = 0.0


#: Adam's epsilon for pre-training: BERT's own (Devlin et al.'s ``optimization.py``); fine-tuning keeps
#: Hugging Face's 1e-8 (:func:`bertlib.optimization.adamw`).
PRETRAIN_ADAM_EPS = 1e-6


def sample_batch(data: PretrainingData, batch_size: int, generator: torch.Generator,
                 mlm_probability: float = 0.15, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """One training batch: ``batch_size`` pairs drawn at random (with replacement) by ``generator``, cut to the
    longest row, and masked afresh with :func:`mask_tokens` (*dynamic* masking: a pair gets new masks each time it
    is drawn). Returns :func:`bert_for_pretraining`'s keyword arguments: ``input_ids`` (masked),
    ``attention_mask``, ``token_type_ids``, ``labels`` (``(batch, seq)`` each) and ``next_sentence_label``
    ``(batch,)``, on ``device``. Defined in chapter 11, *Pre-training*."""
    idx = torch.randint(len(data), (batch_size,), generator=generator)
    am = data.attention_mask[idx]
    width = int(am.sum(1).max())
    ids, am = data.input_ids[idx, :width], am[:, :width]
    masked, labels = mask_tokens(ids, data.special_tokens_mask[idx, :width], data.vocab_size, data.mask_token_id,
                                 mlm_probability, generator=generator)
    batch = dict(input_ids=masked, attention_mask=am, token_type_ids=data.token_type_ids[idx, :width],
                 labels=labels, next_sentence_label=data.next_sentence_label[idx])
    return {k: v.to(device) for k, v in batch.items()}


def train_step(model: BertPretrainingModel, batch: Mapping[str, torch.Tensor], optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler | None = None, *,
               max_grad_norm: float | None = 1.0) -> PreTrainingOutput:
    """One MLM + NSP step on ``batch`` (from :func:`sample_batch`): forward with the MLM head at the masked
    positions only, the summed loss, backward, then :func:`bertlib.optimization.optimizer_step` (clip the gradient
    norm to ``max_grad_norm``, AdamW step, schedule step, zero the gradients). Returns the forward's output (losses
    included, detached). Defined in chapter 11, *Pre-training*."""
    out = model(**batch, masked_only=True)
    out.loss.backward()
    optimizer_step(model.parameters(), optimizer, scheduler, max_grad_norm)
    for name in ("loss", "mlm_loss", "nsp_loss", "prediction_logits", "seq_relationship_logits"):
        setattr(out, name, getattr(out, name).detach())
    return out


def optimizer_and_schedule(model: BertPretrainingModel, *, steps: int, lr: float, warmup: float = 0.1,
                           weight_decay: float = 0.01) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """What :func:`pretrain` trains with: AdamW (:func:`bertlib.optimization.adamw`; ``weight_decay`` on all but
    biases and LayerNorm weights, epsilon :data:`PRETRAIN_ADAM_EPS`) and a linear warm-up over the first ``warmup``
    fraction of the ``steps``, then linear decay to 0 (:func:`bertlib.optimization.schedule`)."""
    optimizer = adamw(model, lr, weight_decay, eps=PRETRAIN_ADAM_EPS)
    return optimizer, schedule(optimizer, steps, warmup)


def pretrain(
    model: BertPretrainingModel,
    data: PretrainingData,
    *,
    steps: int,
    batch_size: int = 32,
    lr: float = 1e-3,
    warmup: float = 0.1,
    weight_decay: float = 0.01,
    mlm_probability: float = 0.15,
    seed: int | None = None,
    max_seconds: float | None = None,
    log: Callable[[str], None] | None = None,
    log_every: int = 100,
) -> TrainingHistory:
    """Train ``model`` on MLM + NSP for ``steps`` steps (or until ``max_seconds`` have passed).

    Each step is :func:`train_step` (gradient norm clipped at 1) on a fresh :func:`sample_batch` of ``batch_size``
    pairs, with :func:`optimizer_and_schedule`: the book's one recipe (:mod:`bertlib.optimization`), AdamW with
    ``weight_decay`` on all but biases and LayerNorm weights and a linear warm-up over the first ``warmup``
    fraction of the steps, then linear decay to 0. Defined in chapter 11, *Pre-training*.
    """
    device = next(model.parameters()).device
    g = torch.Generator().manual_seed(resolve_seed(seed))
    opt, sched = optimizer_and_schedule(model, steps=steps, lr=lr, warmup=warmup, weight_decay=weight_decay)
    hist = TrainingHistory()
    start = time.perf_counter()
    model.train()
    for step in range(steps):
        lr_now = sched.get_last_lr()[0]  # the rate this step runs at
        out = train_step(model, sample_batch(data, batch_size, g, mlm_probability, device), opt, sched)
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
