"""Frozen features: one vector per post from the pre-trained network, and a logistic regression on them (chapter 9,
*frozen features*; on whole posts in windows, *whole posts*).

The network is not trained: it runs once over every post (eval mode, no gradients) and each post keeps three
vectors, the final hidden state of ``[CLS]``, the pooler output (chapter 8) and the mean of the final hidden states
over its real tokens. A post is read either truncated (:func:`bertlib.data.newsgroups.encode`) or whole, in windows
(:func:`bertlib.data.windows.encode_windows`) whose vectors are averaged (:func:`bertlib.data.windows.pool_windows`). A
standardised logistic regression per vector is the classifier; its ``C`` is chosen on the validation split
(:func:`fit_probe`). The command (``bertlib-features``, or ``python -m bertlib.evaluation.features``; its options:
:class:`FeaturesConfig`) reads the posts a profile reads (:data:`bertlib.data.newsgroups.POSTS`), the same splits
as ``bertlib-finetune`` with that profile::

    python -m bertlib.evaluation.features --profile cpu --out results/frozen-cpu/as-distributed
    python -m bertlib.evaluation.features --profile cpu --out results/frozen-cpu/no-headers --remove-headers

and writes ``OUT/metrics.json`` (scores only: no data, no weights). The pieces, in order: :func:`frozen_features`,
:func:`post_features`, :func:`fit_probe`, :func:`evaluate_frozen`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from bertlib.data.batches import collate, length_sorted_batches
from bertlib.data.corpus import check_sizes
from bertlib.data.files import check_output, write_text
from bertlib.data.newsgroups import POSTS, NewsData, encode, load_data
from bertlib.data.windows import check_windows, encode_windows, pool_windows
from bertlib.evaluation.inference import best_on_validation, scores
from bertlib.model.encoder import FAST, bert_forward
from bertlib.model.pretrained import Pretrained, check_max_length, load_pretrained
from bertlib.model.runtime import check_device, default_seed, get_device, get_profile, hardware, progress_enabled
from bertlib.tasks.classifier import mean_pool

#: The three vectors of a post, in the order chapter 9 shows them.
KINDS: tuple[str, ...] = ("[CLS]", "pooler", "mean")

#: The logistic regression's regularisation strengths tried (the best validation accuracy is kept).
PROBE_C: tuple[float, ...] = (0.01, 0.1, 1.0)

#: How a post is read: truncated as in fine-tuning, or whole in windows whose vectors are averaged.
READINGS: tuple[str, ...] = ("truncated", "windows")


@torch.no_grad()
def frozen_features(pretrained: Pretrained, seqs: list[list[int]], batch_size: int = 64) -> dict[str, torch.Tensor]:
    """``[CLS]``, pooler and mean-pooled vectors of every sequence: ``kind -> (len(seqs), hidden)`` float32 on the
    CPU, in the order of ``seqs``. One forward pass of :func:`bertlib.bert_forward` in length-sorted batches of
    ``batch_size`` (little padding); the mean is over real tokens only. The pass runs SDPA attention and one-kernel
    LayerNorm/GELU and keeps no per-layer outputs (chapter 14): the same vectors, about 1.4× faster on a CPU."""
    sd, config = pretrained.state_dict, pretrained.config
    device = next(iter(sd.values())).device
    out = {k: torch.empty(len(seqs), config.hidden_size) for k in KINDS}
    batches = length_sorted_batches([len(s) for s in seqs], batch_size)
    for idx in tqdm(batches, desc="frozen features", unit="batch", disable=not progress_enabled() or len(batches) < 20):
        idx = torch.as_tensor(idx)
        batch = collate([seqs[i] for i in idx], pretrained.tokenizer.pad_token_id, device)
        res = bert_forward(sd, config, **batch, **FAST)
        hidden = res.last_hidden_state                                         # (batch, seq, hidden)
        out["[CLS]"][idx] = hidden[:, 0].float().cpu()
        out["pooler"][idx] = res.pooler_output.float().cpu()
        out["mean"][idx] = mean_pool(hidden, batch["attention_mask"]).float().cpu()  # over real tokens
    return out


def post_features(pretrained: Pretrained, texts: list[str], max_length: int, reading: str = "truncated", *,
                  truncation: str = "head_tail", stride: int = 0, batch_size: int = 64) -> dict[str, np.ndarray]:
    """One vector of each kind per post: ``kind -> (len(texts), hidden)``. ``reading="truncated"``: of the post cut
    to ``max_length`` ids by ``truncation``; ``"windows"``: the mean of its windows' vectors (windows of
    ``max_length`` ids sharing ``stride`` tokens, :func:`bertlib.data.windows.encode_windows`)."""
    tok = pretrained.tokenizer
    if reading == "truncated":
        seqs, post = encode(tok, texts, max_length, truncation), np.arange(len(texts))
    elif reading == "windows":
        seqs, post = encode_windows(tok, texts, max_length, stride)
    else:
        raise ValueError(f"reading must be one of {READINGS}, got {reading!r}.")
    feats = frozen_features(pretrained, seqs, batch_size)
    post = torch.as_tensor(post)
    return {k: pool_windows(v, post, len(texts), "mean").numpy() for k, v in feats.items()}


@dataclass
class Probe:
    """A logistic regression on standardised frozen features, with the ``C`` validation chose."""

    model: object
    C: float
    val_accuracy: float

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.model.predict(features)


def fit_probe(train_features: np.ndarray, train_labels, val_features: np.ndarray, val_labels,
              grid: tuple[float, ...] = PROBE_C, standardize: bool = True) -> Probe:
    """Fit ``StandardScaler + LogisticRegression(C)`` (without the scaler when ``standardize`` is False) on the
    training posts for every ``C`` in ``grid``; keep the one with the best validation accuracy (the smaller ``C`` on
    a tie). The test posts play no part."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    def fitted():
        for C in grid:
            model = make_pipeline(*[StandardScaler()] * standardize, LogisticRegression(C=C, max_iter=5000))
            model.fit(train_features, train_labels)
            acc = float(model.score(val_features, val_labels))
            yield Probe(model, C, acc), acc

    return best_on_validation(fitted())[0]


def _arg(help: str, default=dataclasses.MISSING, **kwargs):
    """A field with its ``--help`` text (``transformers.HfArgumentParser`` reads it)."""
    return field(default=default, metadata={"help": help}, **kwargs)


@dataclass(frozen=True)
class FeaturesConfig:
    """The settings of ``bertlib-features``: which posts (a profile's, :data:`bertlib.data.newsgroups.POSTS`; a
    :class:`~bertlib.data.newsgroups.Selection`), how each is read, and the model. The defaults are the ``quick``
    profile's; ``--profile`` sets the others."""

    out: str = _arg("output directory (OUT/metrics.json)")
    profile: Literal["quick", "cpu", "full"] = _arg("the posts of bertlib-finetune's profile of this name (unset: "
                                                    "$BERTLIB_PROFILE, else full on CUDA and quick on CPU)", "quick")
    remove_headers: bool = _arg("remove headers, signatures and quoted replies", False)
    data_seed: int = _arg("seed of the subsets and the validation split ($BERTLIB_SEED, else 0)",
                          default_factory=default_seed)
    train_size: int | None = _arg("training posts (stratified); none: all 11,314", POSTS["quick"]["train_size"])
    val_fraction: float = _arg("share of those held out for validation (choosing C)",
                                POSTS["quick"]["val_fraction"])
    test_size: int | None = _arg("test posts (stratified); none: all 7,532", POSTS["quick"]["test_size"])
    all_data: bool = _arg("every training and test post (train_size = test_size = none)", False)
    max_length: int = _arg("tokens per post or window, [CLS] and [SEP] included", POSTS["quick"]["max_length"])
    truncation: Literal["head", "head_tail"] = _arg("truncated reading: the first tokens, or head+tail",
                                                   POSTS["quick"]["truncation"])
    window_stride: int = _arg("windows reading: tokens shared by consecutive windows", POSTS["quick"]["window_stride"])
    batch_size: int = _arg("sequences per forward pass", 64)
    model: str | None = _arg("local directory or Hub id (None: $BERTLIB_MODEL, else all-MiniLM-L6-v2)", None)
    device: str | None = _arg("cpu or cuda (None: bertlib.get_device())", None)
    archive: str | None = _arg("20news-bydate.tar.gz (None: $BERTLIB_20NG_ARCHIVE)", None)


def parse_args(argv: list[str] | None = None) -> FeaturesConfig:
    """The command line → :class:`FeaturesConfig`; the chosen profile's posts are the defaults (``--help`` shows
    them) and an option wins."""
    from transformers import HfArgumentParser

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--profile")
    pre.add_argument("--device")
    known, _ = pre.parse_known_args(argv)
    profile = known.profile or get_profile(torch.device(known.device) if known.device else get_device())
    parser = HfArgumentParser(FeaturesConfig, prog="bertlib-features", description=__doc__.splitlines()[0])
    parser.set_defaults(**POSTS.get(profile, {}), profile=profile)
    try:
        (cfg,) = parser.parse_args_into_dataclasses(argv, look_for_args_file=False)
    except ValueError as err:  # an option this command does not have (e.g. fine-tuning's --epochs)
        parser.error(str(err))
    return dataclasses.replace(cfg, train_size=None, test_size=None) if cfg.all_data else cfg


def evaluate_frozen(pretrained: Pretrained, data: NewsData, cfg: FeaturesConfig,
                    readings: tuple[str, ...] = READINGS, say=print) -> dict[str, dict]:
    """Every reading × kind on ``data`` (``cfg.max_length``, ``cfg.truncation``, ``cfg.window_stride``):
    ``"windows/mean" -> {accuracy, macro_f1, per_class_f1, val_accuracy, C, seconds}``; ``C`` chosen on
    validation, the test posts scored once."""
    out = {}
    for reading in readings:
        t0 = time.perf_counter()
        feats = {split: post_features(pretrained, getattr(data, split).texts, cfg.max_length, reading,
                                      truncation=cfg.truncation, stride=cfg.window_stride,
                                      batch_size=cfg.batch_size) for split in ("train", "val", "test")}
        encode_s = time.perf_counter() - t0
        for kind in KINDS:
            probe = fit_probe(feats["train"][kind], data.train.labels, feats["val"][kind], data.val.labels)
            pred = probe.predict(feats["test"][kind])
            row = {**scores(data.test.labels, pred, data.label_names), "val_accuracy": probe.val_accuracy,
                   "C": probe.C, "features_seconds": round(encode_s, 1)}
            out[f"{reading}/{kind}"] = row
            say(f"[features] {reading:<9} {kind:<7} C={probe.C:<5g} validation {probe.val_accuracy:.4f} "
                f"test {row['accuracy']:.4f} macro_f1 {row['macro_f1']:.4f}")
    return out


def main(argv: list[str] | None = None) -> int:
    """``bertlib-features --profile cpu --out DIR [--remove-headers]``: the profile's splits, ``DIR/metrics.json``
    (options: :class:`FeaturesConfig`)."""
    cfg = parse_args(argv)
    try:
        check_windows(cfg.max_length, cfg.window_stride)  # before loading anything: a clear error, no traceback
        check_sizes(cfg.train_size, cfg.test_size, cfg.val_fraction)
        check_output(cfg.out, "--out", directory=True)
        device = check_device(cfg.device, "--device") if cfg.device else get_device()
    except ValueError as err:
        print(f"bertlib-features: error: {err}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    data = load_data(cfg, remove_headers=cfg.remove_headers, archive=cfg.archive)
    pretrained = load_pretrained(cfg.model, device=device)
    check_max_length(cfg.max_length, pretrained)
    print(f"[features] profile {cfg.profile} remove_headers={cfg.remove_headers} train={len(data.train)} "
          f"val={len(data.val)} test={len(data.test)} max_length={cfg.max_length} stride={cfg.window_stride}",
          flush=True)
    results = evaluate_frozen(pretrained, data, cfg, say=lambda s: print(s, flush=True))
    argv_used = sys.argv[1:] if argv is None else argv
    metrics = {"command": shlex.join(["python", "-m", "bertlib.evaluation.features", *argv_used]),
               "profile": cfg.profile, "remove_headers": cfg.remove_headers, "data_seed": cfg.data_seed,
               "train_size": len(data.train), "val_size": len(data.val), "test_size": len(data.test),
               "max_length": cfg.max_length, "truncation": cfg.truncation, "window_stride": cfg.window_stride,
               "model": pretrained.name, "results": results,
               "wall_seconds": round(time.perf_counter() - t0, 1), "hardware": hardware(device)}
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "metrics.json", json.dumps(metrics, indent=1) + "\n")
    print(f"[features] wrote {out / 'metrics.json'} in {metrics['wall_seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
