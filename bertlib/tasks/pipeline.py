"""What ``transformers.pipeline("text-classification")`` does, one stage at a time (chapter 10, *What pipeline does*).

The pipeline runs three stages per call, and this module writes each one out so that it can be compared with the
real one:

* :func:`preprocess`: the tokenizer, one text at a time, then the padded batch the pipeline's collate function
  builds (:func:`pad_batch`);
* :func:`forward`: the classifier's logits (the pipeline's ``_forward``), in eval mode and without gradients;
* :func:`postprocess`: logits → scores (:func:`stable_softmax`, :func:`sigmoid` or nothing, chosen by
  :func:`default_function` from the config) → ``[{"label": ..., "score": ...}, ...]`` sorted, cut to ``top_k``.

:func:`classify` chains them: ``classify(clf, tokenizer, texts, id2label, max_length=L, top_k=k)`` returns what
``pipe(texts, top_k=k, truncation=True, max_length=L)`` returns for the same model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from bertlib.data.batches import pad_batch  # noqa: F401  (the collate stage; one padding function for the book, in bertlib.data)

#: The values of the pipeline's ``function_to_apply`` (``ClassificationFunction``), lower case.
FUNCTIONS = ("softmax", "sigmoid", "none")


def _texts(texts: str | Sequence[str]) -> list[str]:
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts:
        raise ValueError("no texts to classify: pass a string or a non-empty list of strings.")
    bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad:
        raise ValueError(f"texts must be strings, got {', '.join(sorted(set(bad)))} (text pairs are not handled here).")
    return texts


def preprocess(tokenizer, texts: str | Sequence[str], max_length: int | None = None) -> dict[str, torch.Tensor]:
    """Tokenize ``texts`` as the pipeline does and pad them into one batch.

    Each text is tokenized alone (``[CLS] text [SEP]``; with ``max_length``, cut at the head to ``max_length``
    tokens, the tokenizer's ``truncation=True``), then :func:`pad_batch` pads the rows to the longest. Returns
    ``input_ids``, ``token_type_ids`` and ``attention_mask``, each ``(batch, seq)``. Without ``max_length`` a text
    longer than the model's positions is *not* cut, as in the pipeline. Defined in chapter 10, *What pipeline does*.
    """
    texts = _texts(texts)
    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must leave room for [CLS] and [SEP] (at least 2), got {max_length}.")
    if tokenizer.pad_token_id is None:
        raise ValueError("the tokenizer has no pad token, so texts of different lengths cannot be batched.")
    cut = dict(truncation=True, max_length=max_length) if max_length is not None else dict(truncation=False)
    encodings = [tokenizer(t, verbose=False, **cut) for t in texts]
    return pad_batch([dict(e) for e in encodings], tokenizer.pad_token_id, tokenizer.padding_side)


@torch.no_grad()
def forward(classifier: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """The pipeline's ``_forward``: ``classifier(**batch)`` in eval mode without gradients, inputs moved to the
    classifier's device, the ``(batch, num_labels)`` float32 logits returned on the CPU. Accepts a
    :class:`~bertlib.tasks.classifier.BertClassifier` (which returns logits) or a Hugging Face model (which returns an
    output with
    ``.logits``); the classifier's train/eval mode is restored. Defined in chapter 10, *What pipeline does*.
    """
    device = next(classifier.parameters()).device
    was_training = classifier.training
    classifier.eval()
    try:
        out = classifier(**{k: v.to(device) for k, v in batch.items()})
    finally:
        classifier.train(was_training)
    logits = out.logits if hasattr(out, "logits") else out
    return logits.float().cpu()


def stable_softmax(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``exp(x - max x) / sum exp(x - max x)`` along ``dim``: the softmax, computed without overflow.

    Subtracting the row's maximum changes nothing mathematically (the factor ``exp(-max)`` cancels) but keeps every
    exponent ``<= 0``, so ``exp`` lies in ``(0, 1]`` and the sum in ``[1, n]``: no ``inf``, no ``0/0``, in any
    dtype. Any shape; same shape out. Defined in chapter 10, *What pipeline does*.
    """
    shifted = logits - logits.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


def sigmoid(logits: torch.Tensor) -> torch.Tensor:
    """``1 / (1 + exp(-x))`` element-wise: an independent probability per label (any shape).
    Defined in chapter 10, *What pipeline does*."""
    return torch.sigmoid(logits)


def default_function(config) -> str:
    """The function the pipeline applies when ``function_to_apply`` is not given, from the model's config:
    ``"none"`` for ``problem_type="regression"``; ``"sigmoid"`` for ``"multi_label_classification"`` or a single
    label (``num_labels == 1``); ``"softmax"`` for ``"single_label_classification"`` or several labels.
    Defined in chapter 10, *What pipeline does*."""
    problem = getattr(config, "problem_type", None)
    if problem == "regression":
        return "none"
    if problem == "multi_label_classification" or config.num_labels == 1:
        return "sigmoid"
    if problem == "single_label_classification" or config.num_labels > 1:
        return "softmax"
    return "none"


def _label_names(id2label: Mapping[int, str] | Sequence[str], n: int) -> list[str]:
    if isinstance(id2label, Mapping):
        try:
            names = [id2label[i] for i in range(n)]
        except KeyError as err:
            raise ValueError(f"id2label has no name for class {err.args[0]} (the logits have {n} classes).") from None
        if len(id2label) != n:
            raise ValueError(f"id2label names {len(id2label)} classes, the logits have {n}.")
        return [str(x) for x in names]
    names = [str(x) for x in id2label]
    if len(names) != n:
        raise ValueError(f"{len(names)} label names for logits with {n} classes.")
    return names


def postprocess(logits: torch.Tensor, id2label: Mapping[int, str] | Sequence[str], function: str = "softmax",
                top_k: int | None = 1) -> list[list[dict[str, float | str]]]:
    """Logits → the pipeline's answer: ``[{"label": name, "score": p}, ...]`` per text, best first.

    ``logits``: ``(batch, num_labels)`` (or ``(num_labels,)`` for one text). ``function``: ``"softmax"``
    (:func:`stable_softmax`), ``"sigmoid"`` or ``"none"`` (the raw logits). ``top_k``: how many labels to keep per
    text (``None``: all). Ties keep the class order, as the pipeline's stable sort does. Returns one list per text,
    what ``pipe(texts, top_k=top_k)`` returns; ``pipe(texts)`` without ``top_k`` gives each list's first dict.
    Defined in chapter 10, *What pipeline does*.
    """
    if function not in FUNCTIONS:
        raise ValueError(f"function must be one of {FUNCTIONS} (the pipeline's function_to_apply), got {function!r}.")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None (all labels), got {top_k!r}.")
    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
    if logits.dim() != 2 or logits.shape[-1] < 1:
        raise ValueError(f"logits must be (batch, num_labels) or (num_labels,), got shape {tuple(logits.shape)}.")
    names = _label_names(id2label, logits.shape[-1])
    x = logits.detach().float().cpu()  # the pipeline also scores in float32 (it upcasts fp16/bf16 outputs)
    scores = {"softmax": stable_softmax, "sigmoid": sigmoid, "none": lambda t: t}[function](x)
    results = []
    for row in scores.tolist():
        order = sorted(range(len(row)), key=lambda i: -row[i])  # stable: ties keep the class order
        results.append([{"label": names[i], "score": row[i]} for i in order[:top_k]])
    return results


def classify(classifier: nn.Module, tokenizer, texts: str | Sequence[str],
             id2label: Mapping[int, str] | Sequence[str], *, max_length: int | None = None, batch_size: int = 8,
             function: str | None = None, top_k: int | None = 1) -> list[list[dict[str, float | str]]]:
    """:func:`preprocess` → :func:`forward` → :func:`postprocess` over ``texts`` in batches of ``batch_size``.

    ``function=None`` picks softmax for several labels and sigmoid for one (the pipeline's rule for a
    classification model, :func:`default_function`). Returns one list of ``top_k`` dicts per text, in the order of
    ``texts``: what ``pipe(texts, top_k=top_k, truncation=True, max_length=max_length, batch_size=batch_size)``
    returns for the same weights. Defined in chapter 10, *What pipeline does*.
    """
    texts = _texts(texts)
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    num_labels = getattr(classifier, "num_labels", None) or classifier.config.num_labels
    if function is None:
        function = "softmax" if num_labels > 1 else "sigmoid"
    results = []
    for start in range(0, len(texts), batch_size):
        batch = preprocess(tokenizer, texts[start:start + batch_size], max_length)
        results += postprocess(forward(classifier, batch), id2label, function, top_k)
    return results
