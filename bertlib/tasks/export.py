"""Hand a fine-tuned :class:`~bertlib.tasks.classifier.BertClassifier` to Hugging Face (chapters 9 and 10).

:func:`export_hf` writes a directory that ``transformers.pipeline("text-classification", model=DIR)`` and
``BertForSequenceClassification.from_pretrained(DIR)`` load as they would any Hub model: ``config.json`` (a
``BertForSequenceClassification`` config with ``id2label``/``label2id``), ``model.safetensors`` and the tokenizer
files.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import BertForSequenceClassification, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from bertlib.tasks.classifier import BertClassifier


def hf_config(classifier: BertClassifier, label_names: Sequence[str]):
    """The classifier's ``BertConfig`` turned into a ``BertForSequenceClassification`` one: ``num_labels``,
    ``id2label``/``label2id`` from ``label_names``, ``problem_type="single_label_classification"`` when there
    are two or more classes (so the pipeline applies a softmax) and ``architectures``."""
    label_names = [str(n) for n in label_names]
    if len(label_names) != classifier.num_labels:
        raise ValueError(
            f"{len(label_names)} label names for a classifier with {classifier.num_labels} outputs; pass one name "
            "per class, in the order of the classifier's outputs (e.g. bunch.target_names)."
        )
    if len(set(label_names)) != len(label_names):
        raise ValueError("label names must be unique: label2id maps each name back to one class index.")
    config = copy.deepcopy(classifier.config)
    config.id2label = dict(enumerate(label_names))
    config.label2id = {name: i for i, name in enumerate(label_names)}
    # transformers refuses a one-output model whose problem_type says single-label classification (it is
    # regression there, and the pipeline applies a sigmoid): leave problem_type unset in that case.
    config.problem_type = "single_label_classification" if classifier.num_labels > 1 else None
    config.architectures = ["BertForSequenceClassification"]
    return config


def to_hf_classifier(classifier: BertClassifier, label_names: Sequence[str]) -> BertForSequenceClassification:
    """A ``transformers.BertForSequenceClassification`` (CPU, float32, eval mode) holding exactly the classifier's
    weights, loaded with ``strict=True`` so any name that does not match fails here. The global random state is
    left untouched (HF's random initialisation runs inside ``torch.random.fork_rng``)."""
    if getattr(classifier, "pooling", "pooler") != "pooler":
        raise ValueError(f"to_hf_classifier: this classifier reads pooling={classifier.pooling!r}, while "
                         "BertForSequenceClassification reads the pooler; only pooling='pooler' exports to it.")
    config = hf_config(classifier, label_names)
    config._attn_implementation = "eager"
    with torch.random.fork_rng(devices=[]):
        model = BertForSequenceClassification(config)
    state = {k: v.detach().to(device="cpu", dtype=torch.float32).contiguous()
             for k, v in classifier.state_dict().items()}
    model.load_state_dict(state, strict=True)
    return model.eval()


def export_hf(
    classifier: BertClassifier,
    tokenizer: PreTrainedTokenizerBase,
    label_names: Sequence[str],
    out_dir: str | os.PathLike,
) -> Path:
    """Write ``classifier`` as a Hugging Face ``BertForSequenceClassification`` directory; returns its path.

    The directory holds ``config.json`` (with ``id2label``), ``model.safetensors`` (float32) and the tokenizer
    files (``tokenizer.json``, ``tokenizer_config.json``, ...), i.e. what ``save_pretrained`` writes, so
    ``transformers.pipeline("text-classification", model=out_dir)`` works offline. Defined in chapter 9,
    *Fine-tuning on 20 Newsgroups*; chapter 10 reads the files back.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = to_hf_classifier(classifier, label_names)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # save_pretrained draws a "Writing model shards" bar on stderr
    try:
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return out
