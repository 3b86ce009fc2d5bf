"""Batches of token ids (chapters 9 and 10): padding a batch and its masks (:func:`pad_batch`, :func:`collate`),
length-sorted batches that waste little on padding (:func:`length_sorted_batches`) and the shuffled length buckets
of a training epoch (:func:`epoch_batches`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

#: The value padding positions get, per key of a tokenized text (``input_ids``: the tokenizer's pad id).
_PAD_VALUES = {"attention_mask": 0, "token_type_ids": 0}


def pad_batch(encodings: Sequence[Mapping[str, Sequence[int]] | Sequence[int]], pad_token_id: int,
              padding_side: str = "right") -> dict[str, torch.Tensor]:
    """One padded batch from texts of different lengths: what ``transformers``' collate functions build
    (the pipeline's ``pad_collate_fn``, ``DataCollatorWithPadding``).

    ``encodings``: one per text, either a mapping (``input_ids`` and any of ``token_type_ids``,
    ``attention_mask``, lists of ints of that text's length, as a tokenizer returns for one text) or a plain list of
    token ids (then ``attention_mask`` is 1 and ``token_type_ids`` 0 on every id: one segment). Returns
    ``(batch, seq)`` long tensors, ``seq`` the longest length: ``input_ids`` padded with ``pad_token_id``, the others
    with 0, on ``padding_side``. Used by chapter 9 (fine-tuning batches) and chapter 10, *What pipeline does*.
    """
    if not encodings:
        raise ValueError("no encodings to pad.")
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}.")
    if not isinstance(encodings[0], Mapping):
        encodings = [{"input_ids": ids, "attention_mask": [1] * len(ids), "token_type_ids": [0] * len(ids)}
                     for ids in encodings]
    keys = set(encodings[0])
    if "input_ids" not in keys or any(not isinstance(e, Mapping) or set(e) != keys for e in encodings):
        raise ValueError("every encoding needs the same keys, input_ids among them.")
    width = max(len(e["input_ids"]) for e in encodings)
    batch = {}
    for key in sorted(keys):
        fill = pad_token_id if key == "input_ids" else _PAD_VALUES.get(key, 0)
        out = torch.full((len(encodings), width), fill, dtype=torch.long)
        for row, e in enumerate(encodings):
            values = torch.as_tensor(list(e[key]), dtype=torch.long)
            if padding_side == "right":
                out[row, :len(values)] = values
            else:
                out[row, width - len(values):] = values
        batch[key] = out
    return batch


def collate(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | str) -> dict[str, torch.Tensor]:
    """Token-id lists → the padded ``(batch, seq)`` batch of :func:`pad_batch` (``input_ids``, ``attention_mask``,
    ``token_type_ids``) on ``device``; on CUDA through pinned memory with a non-blocking copy."""
    device = torch.device(device)
    batch = pad_batch(seqs, pad_id)
    if device.type == "cuda":
        return {k: v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}
    return {k: v.to(device) for k, v in batch.items()}


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[np.ndarray]:
    """Indices of the texts in batches of ``batch_size``, shortest texts first (a stable sort, so equal lengths
    keep their order): each batch is padded to nearly its own length, so little work goes to padding. Inference
    batches this way (:func:`bertlib.evaluation.inference.predict_logits`,
    :func:`bertlib.evaluation.features.frozen_features`, the
    benchmark's workload); training shuffles first (:func:`bertlib.data.batches.epoch_batches`)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int,
                  bucket_batches: int = 50) -> list[np.ndarray]:
    """The training batches of ``epoch``, a pure function of ``(seed, epoch)``: shuffle, cut into buckets of
    ``bucket_batches * batch_size`` posts, sort each bucket by length and cut it into batches (little padding),
    then shuffle the batches (so lengths do not come in order). A resumed run rebuilds the same list and skips
    the batches it already consumed."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    chunk = batch_size * bucket_batches
    batches = []
    for start in range(0, len(order), chunk):
        bucket = order[start:start + chunk]
        bucket = bucket[np.argsort(lengths[bucket], kind="stable")]
        batches += [bucket[i:i + batch_size] for i in range(0, len(bucket), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]
