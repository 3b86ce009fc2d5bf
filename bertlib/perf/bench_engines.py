"""The engines section of ``python -m bertlib.perf.bench`` (issue 29; appendix 14, *Making it fast*): chapter 9's
fine-tuned classifier (or a linear probe) on 20 Newsgroups test posts through Hugging Face, bertlib and the engines
of :mod:`bertlib.perf.engines`, interleaved batch by batch over rounds; :mod:`bertlib.perf.bench` prints its table.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm, trange

from bertlib.data.batches import collate, length_sorted_batches
from bertlib.data.files import project_path
from bertlib.model.encoder import FAST, bert_forward
from bertlib.model.pretrained import Pretrained
from bertlib.model.runtime import progress_enabled, resolve_seed, seeded
from bertlib.perf.timing import keep_freed_memory, release_freed_memory, time_rounds, timed

#: A row ``counts`` when its accuracy is within this many percentage points of fp32 bertlib's.
COUNTS_WITHIN_POINTS = 0.3
#: The fp32 bertlib row every other row's predictions and accuracy are compared with.
REFERENCE = "bertlib padding-free, length-sorted"
#: The reference's forward pass under bfloat16 autocast (issue 37): skipped on CPUs without native bfloat16.
BF16_ROW = "bertlib padding-free bf16 autocast, length-sorted"


def padded_batches(enc: list[list[int]], batches: list, pad_id: int, device: torch.device):
    """``(indices, input_ids, attention_mask)`` of each batch of indices, padded to its own longest post
    (:func:`bertlib.data.batches.collate`)."""
    for idx in batches:
        batch = collate([enc[j] for j in idx], pad_id, device)
        yield idx, batch["input_ids"], batch["attention_mask"]



BENCH_DIR = project_path("_build") / "bench"


def workload_classifier(pt: Pretrained, device: torch.device, max_steps: int | None = None,
                        out_dir: str | Path | None = None, seed: int | None = None):
    """Chapter 9's quick-profile classifier (``bertlib.training.finetune``, 300 stratified training posts, 128
    tokens), fine-
    tuned once and kept under ``out_dir`` (default :data:`BENCH_DIR`); ``max_steps`` stops it early (chapter 14's
    quick profile). Returns ``(model, label_names, info)``, the model in eval mode on ``device``."""
    import hashlib

    seed = resolve_seed(seed)  # default: $BERTLIB_SEED, else 0

    from bertlib.data import newsgroups
    from bertlib.training import checkpoint, finetune_config
    from bertlib.training import finetune as ft
    from bertlib.training.checkpoint import load_weights

    key = hashlib.sha1(f"{pt.source}|{sorted(pt.state_dict)[:3]}|{pt.config.to_json_string()}".encode())
    tag = f"classifier-{key.hexdigest()[:10]}-seed{seed}-" + (f"{max_steps}steps" if max_steps else "quick")
    out = Path(out_dir or BENCH_DIR) / tag
    # the engines run HF's classifier (the pooled [CLS]), trained on the quick draw the engine rows were measured on
    # (before 2026-11-28: 300 posts trained, 200 validated, the validation posts' first tokens)
    cfg = finetune_config.profile_config("quick", max_steps=max_steps, seed=seed, data_seed=seed, test_size=20,
                                         device=str(device), pooling="pooler", **newsgroups.QUICK_BEFORE,
                                         eval_windows=False)
    data = newsgroups.load_data(cfg, remove_headers=cfg.remove_headers)
    t0 = time.perf_counter()
    trained_here = not (out / checkpoint.METRICS).exists()
    if trained_here:
        with seeded(seed):
            ft.train(cfg, out, data=data, pretrained=pt, export=False, verbose=False)
    model = ft.build_model(cfg, pt, len(data.label_names), device)
    load_weights(model, out / checkpoint.BEST)
    info = {"kind": "fine-tuned (bertlib.training.finetune, quick profile)", "dir": str(out), "max_steps": max_steps,
            "train_posts": len(data.train),
            "seconds": round(time.perf_counter() - t0, 1), "trained_here": trained_here}
    return model.eval(), list(data.label_names), info


def probe_classifier(pt: Pretrained, device: torch.device, n_train: int = 240, max_length: int = 128,
                     seed: int | None = None):
    """A cheap stand-in for :func:`workload_classifier` (chapter 14's quick profile): the pretrained encoder
    unchanged and a classifier layer fit by logistic regression on the pooler outputs of ``n_train`` stratified
    training posts (a linear probe, chapter 9). The engines run the whole model either way; only its accuracy is
    lower. Returns ``(model, label_names, info)`` like :func:`workload_classifier`."""
    from sklearn.linear_model import LogisticRegression

    from bertlib.data import batches as data_batches
    from bertlib.data import newsgroups
    from bertlib.tasks.classifier import BertClassifier
    from bertlib.training import finetune_config

    t0, seed = time.perf_counter(), resolve_seed(seed)
    cfg = finetune_config.profile_config("quick", train_size=n_train, seed=seed, data_seed=seed, test_size=20)
    data = newsgroups.load_data(cfg, remove_headers=cfg.remove_headers)
    texts = list(data.train.texts) + list(data.val.texts)
    labels = np.concatenate([data.train.labels, data.val.labels])
    seqs = newsgroups.encode(pt.tokenizer, texts, max_length, "head_tail")
    model = BertClassifier(pt.state_dict, pt.config, len(data.label_names), attn_implementation="sdpa",
                           fused=True).to(device).eval()
    feats = []
    with torch.inference_mode():
        for i in range(0, len(seqs), 32):
            batch = data_batches.collate(seqs[i:i + 32], pt.tokenizer.pad_token_id, device)
            feats.append(bert_forward(pt.state_dict, pt.config, **batch, **FAST, check=False)
                         .pooler_output.float().cpu())
    fit = LogisticRegression(C=1.0, max_iter=2000).fit(torch.cat(feats).numpy(), labels)
    with torch.no_grad():
        model.classifier.weight.copy_(torch.as_tensor(fit.coef_, dtype=torch.float32))
        model.classifier.bias.copy_(torch.as_tensor(fit.intercept_, dtype=torch.float32))
    info = {"kind": "linear probe (encoder not fine-tuned)", "train_posts": len(seqs),
            "seconds": round(time.perf_counter() - t0, 1)}
    return model, list(data.label_names), info


def _accuracy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return float((logits.argmax(-1) == labels).float().mean())


@dataclass(frozen=True)
class EngineSettings:
    """What :func:`engine_rows` runs: the first ``n_posts`` test posts (None: all 7,532) cut to ``max_length`` tokens,
    in batches of ``batch_size``, for ``rounds`` rounds; ``engines``: the optional rows (None: every name in
    :data:`ENGINE_METHODS`); ``workdir``: where the engines keep their files (None: :data:`BENCH_DIR`);
    ``latency_repeats``: rounds of the one-post latency; ``core=False`` leaves out ``hf-sdpa, length-sorted`` and
    ``bertlib-sdpa, length-sorted`` (the quick profile: :func:`bertlib.perf.bench.workload_rows` times them
    already); ``accuracy_posts``: see :func:`engine_rows` (None: no accuracy pass; 0: every test post)."""

    n_posts: int | None = 512
    max_length: int = 512
    batch_size: int = 32
    rounds: int = 3
    engines: Sequence[str] | None = None
    workdir: str | Path | None = None
    latency_repeats: int = 7
    core: bool = True
    accuracy_posts: int | None = None


@dataclass
class _Posts:
    """The timed posts of :func:`engine_rows`: token ids, classes, the two batch orders (lists of indices) and the
    warm-up batch ``(input_ids, attention_mask)`` of the longest posts."""

    enc: list[list[int]]
    labels: torch.Tensor
    naive: list[list[int]]
    by_length: list[list[int]]
    warm: tuple
    pad: int

    @property
    def lengths(self) -> list[int]:
        return [len(e) for e in self.enc]


def engine_rows(model, tokenizer, label_names: list[str], device: torch.device, settings: EngineSettings) -> dict:
    """The 20 Newsgroups test posts classified by ``model`` through each engine (:mod:`bertlib.perf.engines`), as
    ``settings`` says (:class:`EngineSettings`).

    Every method runs every batch in turn (interleaved, batch by batch) for ``settings.rounds`` rounds; posts/s is
    the median over rounds with its min and max; each speed-up over ``hf-sdpa, naive batches`` is taken within a
    round (median, min, max over rounds). ``latency_ms`` is one real post cut to 128 tokens, timed in interleaved
    rounds. ``accuracy`` is on the same posts; ``delta_points`` is the gap to fp32 bertlib (``bertlib padding-free``)
    in percentage points, and a row ``counts`` when it is within :data:`COUNTS_WITHIN_POINTS` points. An absent
    package skips its row with a message.
    ``settings.accuracy_posts`` (more than ``n_posts``; 0: every test post): each row that changed a prediction of
    fp32 bertlib on the timed posts (the int8 rows) is scored once more, with fp32 bertlib, on that many posts, and
    its accuracy, ``delta_points`` and ``counts`` come from them (``accuracy_posts`` in the row says how many; fp32
    bertlib's accuracy there is ``setup["fp32_accuracy_on_accuracy_posts"]``). On 512 posts one changed prediction
    is 0.2 points, and a row that changes a few dozen predictions passes or fails the 0.3-point rule by chance.
    The engines are CPU engines and the issue's workload is a 2-core CPU one: on a GPU machine this runs on its
    CPU (``device`` is then ignored). Returns ``{"rows": [...], "skipped": {name: why}, "setup": {...}}``."""
    from bertlib.data.corpus import load_20newsgroups
    from bertlib.tasks.export import to_hf_classifier

    s, device, model = settings, torch.device("cpu"), model.cpu().eval()
    test = load_20newsgroups("test")
    assert list(test.target_names) == list(label_names), "the classifier's classes are the dataset's, in order"
    posts = _posts(tokenizer, test.data[:s.n_posts], test.target[:s.n_posts], s)
    hf = to_hf_classifier(model, label_names).to(device)
    hf.set_attn_implementation("sdpa")
    methods, skipped = _methods(model, hf, tokenizer, label_names, posts, s)
    keep_freed_memory()
    batches = {name: list(padded_batches(posts.enc, order, posts.pad, device)) for name, (order, _) in methods.items()}
    logits, seconds = _run_rounds(methods, batches, posts.warm, s.rounds, len(posts.naive), len(posts.enc),
                                  len(label_names), device)
    latency = _latency(methods, posts, tokenizer.sep_token_id, s.latency_repeats)
    rows = [_engine_row(name, fn, seconds, latency, logits, posts.labels, sum(posts.lengths))
            for name, (_, fn) in methods.items()]
    setup_info = {"posts": len(posts.enc), "max_length": s.max_length, "batch_size": s.batch_size,
                  "rounds": s.rounds, "threads": torch.get_num_threads(),
                  "mean_tokens": round(float(np.mean(posts.lengths)), 1), "load_average": _load()}
    n_more = min(s.accuracy_posts or len(test.data), len(test.data)) if s.accuracy_posts is not None else 0
    if n_more > len(posts.enc):
        batches.clear()
        more = test.data[:n_more], torch.as_tensor(test.target[:n_more])
        setup_info["fp32_accuracy_on_accuracy_posts"] = _score_again(
            rows, methods, more, len(label_names), tokenizer, s.max_length, s.batch_size, device)
    return {"rows": rows, "skipped": skipped, "setup": setup_info}


def _posts(tokenizer, texts: list[str], targets, settings: EngineSettings) -> _Posts:
    """``texts`` as :func:`engine_rows` times them: cut to ``settings.max_length`` tokens (head + tail), in naive
    (dataset order) and length-sorted batches of ``settings.batch_size``."""
    from bertlib.data.newsgroups import encode

    enc = encode(tokenizer, texts, settings.max_length, "head_tail")
    lengths, size = [len(e) for e in enc], settings.batch_size
    naive = [list(range(i, min(i + size, len(enc)))) for i in range(0, len(enc), size)]
    longest = np.argsort(lengths, kind="stable")[-size:].tolist()
    warm = next(padded_batches(enc, [longest], tokenizer.pad_token_id, torch.device("cpu")))[1:]
    return _Posts(enc, torch.as_tensor(targets), naive, length_sorted_batches(lengths, size), warm,
                  tokenizer.pad_token_id)


def _methods(model, hf, tokenizer, label_names: list[str], posts: _Posts,
             settings: EngineSettings) -> tuple[dict[str, tuple[list, object]], dict[str, str]]:
    """The rows :func:`engine_rows` times, name → ``(batch order, engine)``: HF's naive and length-sorted batches,
    bertlib's SDPA and padding-free paths, then each optional engine that builds here; and the skipped ones with why."""
    from bertlib.perf import engines as E

    hf_fn = E.Engine("hf-sdpa", lambda ids, m: hf(input_ids=ids, attention_mask=m).logits)
    methods: dict[str, tuple[list, E.Engine]] = {
        "hf-sdpa, naive batches": (posts.naive, hf_fn),
        "hf-sdpa, length-sorted": (posts.by_length, hf_fn),
        "bertlib-sdpa, length-sorted": (posts.by_length, E.make_bertlib(model, "sdpa")),
        REFERENCE: (posts.by_length, E.make_bertlib(model, "unpadded")),
    }
    if not settings.core:
        del methods["hf-sdpa, length-sorted"], methods["bertlib-sdpa, length-sorted"]
    skipped: dict[str, str] = {}
    workdir = Path(settings.workdir or BENCH_DIR) / "engines"
    workdir.mkdir(parents=True, exist_ok=True)
    # this run's own ONNX files: two runs at once (a chapter and the bench) must not read each other's half-written
    # files; every engine has read its file into memory when the directory goes
    with tempfile.TemporaryDirectory(dir=workdir, prefix="onnx-") as onnx_dir:
        builders = _engine_builders(model, hf, tokenizer, label_names, posts, workdir, Path(onnx_dir))
        for name in (ENGINE_METHODS if settings.engines is None else settings.engines):
            try:
                t0 = time.perf_counter()
                methods[name] = builders[name]()
                methods[name][1].prepare_s = round(time.perf_counter() - t0, 1)
            except E.EngineUnavailable as e:
                skipped[name] = str(e)
                print(f"bench: skipping {name}: {e}")
    return methods, skipped


def _latency(methods: dict, posts: _Posts, sep_id: int, repeats: int) -> dict[str, list[float]]:
    """Each method's milliseconds per round for one real post of 128 tokens (the first that long, cut there; else
    the longest), timed in ``repeats`` interleaved rounds."""
    lengths = posts.lengths
    with torch.inference_mode():
        first = next((i for i, n in enumerate(lengths) if n >= 128), int(np.argmax(lengths)))
        one = torch.tensor([posts.enc[first][:127] + [sep_id]])
        one_mask = torch.ones_like(one)
        calls = {name: (lambda fn=fn: fn(one, one_mask)) for name, (_, fn) in methods.items()}
        return time_rounds(calls, torch.device("cpu"), repeats)


def _score_again(rows: list[dict], methods: dict, posts: tuple, n_labels: int, tokenizer, max_length: int,
                 batch_size: int, device: torch.device) -> float | None:
    """:func:`engine_rows`' accuracy pass: fp32 bertlib and every row whose predictions differed from it on the
    timed posts classify ``posts`` (``(texts, labels)``) once, in length-sorted batches; those rows' accuracy
    fields are replaced by these (``rows`` is changed in place; the other methods are dropped from ``methods``,
    which is done with after timing). Returns fp32 bertlib's accuracy on ``posts``
    (``None`` if no row changed a prediction)."""
    from bertlib.data.newsgroups import encode

    again = [r for r in rows if r["changed"] > 0 and r["method"] != REFERENCE]
    if not again:
        return None
    # the engines not scored again go first (their sessions, arenas and buffers), and the memory the timing kept
    # for reuse goes back: the long pass below must not run out of memory on a 24 GB machine
    for name in set(methods) - {REFERENCE} - {r["method"] for r in again}:
        del methods[name]
    gc.collect()
    release_freed_memory()
    texts, labels = posts
    enc = encode(tokenizer, texts, max_length, "head_tail")
    batches = list(padded_batches(enc, length_sorted_batches([len(e) for e in enc], batch_size),
                                  tokenizer.pad_token_id, device))
    logits = {}
    with torch.inference_mode():
        for name in [REFERENCE] + [r["method"] for r in again]:
            logits[name] = torch.empty(len(enc), n_labels)
            for idx, ids, mask in tqdm(batches, desc=f"accuracy on {len(enc)} posts: {name}", leave=False,
                                       disable=not progress_enabled()):
                logits[name][idx] = methods[name][1](ids, mask).float().cpu()
    for row in again:
        row.update(_accuracy_fields(logits[row["method"]], logits[REFERENCE], labels))
    return round(_accuracy(logits[REFERENCE], labels), 4)


def _engine_builders(model, hf, tokenizer, label_names: list[str], posts: _Posts, workdir: Path,
                     onnx_dir: Path) -> dict:
    """Name → a function that builds that optional row of :func:`engine_rows`: ``(batch order, engine)``."""
    from bertlib.perf import engines as E

    onnx_path, hf_onnx = onnx_dir / "bertlib-classifier.onnx", onnx_dir / "hf-classifier.onnx"
    done: set[Path] = set()

    def exported(path: Path, hf_model=None) -> Path:  # each graph exported once per run
        if path not in done:
            E.export_onnx(model, path, hf_model=hf_model)
            done.add(path)
        return path

    naive, by_length, warm = posts.naive, posts.by_length, posts.warm
    return {
        "hf-eager, naive batches": lambda: (naive, E.Engine("hf-eager", _hf_eager(model, label_names))),
        "hf-sdpa int8 (torch.ao quantize_dynamic), length-sorted": lambda: (by_length, _hf_int8(hf)),
        "bertlib padding-free int8, length-sorted": lambda: (by_length, E.make_int8(model, "unpadded")),
        "bertlib padding-free, prepacked weights, length-sorted": lambda: (by_length, E.make_packed(model)),
        BF16_ROW: lambda: (by_length, E.make_bf16(model, "unpadded")),
        "bertlib-sdpa + torch.compile, length-sorted": lambda: (by_length, E.make_compiled(model, "sdpa", warm)),
        "ONNX Runtime (bertlib's graph), length-sorted": lambda: (by_length, E.make_ort(
            model, exported(onnx_path), optimize=False)),
        "ONNX Runtime + transformer optimizer, length-sorted": lambda: (by_length, E.make_ort(
            model, exported(onnx_path), optimize=True)),
        "ONNX Runtime + transformer optimizer (HF's graph), length-sorted": lambda: (by_length, E.make_ort(
            model, exported(hf_onnx, hf), optimize=True)),
        "ONNX Runtime + optimizer, int8 weights, length-sorted": lambda: (by_length, E.make_ort(
            model, exported(onnx_path), optimize=True, int8=True)),
        "OpenVINO (bertlib's graph), length-sorted": lambda: (by_length, E.make_openvino(
            model, exported(onnx_path))),
        "CTranslate2, length-sorted": lambda: (by_length, E.make_ctranslate2(model, tokenizer, workdir)),
        "CTranslate2 int8, length-sorted": lambda: (by_length, E.make_ctranslate2(model, tokenizer, workdir, "int8")),
    }


def _run_rounds(methods: dict, batches: dict, warm: tuple, rounds: int, n_batches: int, n_posts: int,
                n_labels: int, device: torch.device) -> tuple[dict[str, torch.Tensor], dict[str, list[float]]]:
    """Every method on batch 0, then every method on batch 1, …, for ``rounds`` rounds (after one warm-up call
    each on ``warm``): each method's ``(n_posts, n_labels)`` logits from the first round and its seconds per
    round."""
    logits = {name: torch.empty(n_posts, n_labels) for name in methods}
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    with torch.inference_mode():
        for _, fn in methods.values():
            fn(*warm)
        for r in range(rounds):
            spent = dict.fromkeys(methods, 0.0)
            for i in trange(n_batches, desc=f"engines, round {r + 1} of {rounds}", leave=False,
                            disable=not progress_enabled()):
                for name, (_, fn) in methods.items():
                    idx, ids, mask = batches[name][i]
                    out, seconds_taken = timed(fn, ids, mask, device=device)
                    spent[name] += seconds_taken
                    if r == 0:
                        logits[name][idx] = out.float().cpu()
            for name in methods:
                seconds[name].append(spent[name])
    return logits, seconds


def _engine_row(name: str, fn, seconds: dict[str, list[float]], latency: dict[str, list[float]],
                logits: dict[str, torch.Tensor], labels: torch.Tensor, n_tokens: int) -> dict:
    """Row ``name`` of :func:`engine_rows` from every method's seconds per round, latencies and logits (by name):
    speed (median, min, max over rounds), the speed-up over HF's naive batches within each round, latency, and
    accuracy against the fp32 bertlib reference (:data:`REFERENCE`)."""
    n, mine, latency_ms = len(labels), seconds[name], latency[name]
    ours, ref_logits = logits[name], logits[REFERENCE]
    per_round = [n / s for s in mine]
    speedups = [b / s for b, s in zip(seconds["hf-sdpa, naive batches"], mine, strict=True)]
    return {
        "method": name, "posts": n, "rounds": len(mine),
        "posts_per_s": round(n / statistics.median(mine), 2),
        "posts_per_s_min": round(min(per_round), 2), "posts_per_s_max": round(max(per_round), 2),
        "real_tokens_per_s": round(n_tokens / statistics.median(mine)),
        "speedup_vs_hf_naive": round(statistics.median(speedups), 3),
        "speedup_min": round(min(speedups), 3), "speedup_max": round(max(speedups), 3),
        "latency_ms_128": round(statistics.median(latency_ms), 2),
        "latency_ms_min": round(min(latency_ms), 2), "latency_ms_max": round(max(latency_ms), 2),
        **_accuracy_fields(ours, ref_logits, labels),
        "max_abs_logit_diff": round(float((ours - ref_logits).abs().max()), 6),
        "prepare_s": fn.prepare_s, "note": fn.note,
    }


def _accuracy_fields(logits: torch.Tensor, ref_logits: torch.Tensor, labels: torch.Tensor) -> dict:
    """Accuracy on ``labels``, the gap to the fp32 reference in points, whether the row counts, and the
    predictions it changed: ``fixed`` (now right), ``broken`` (now wrong), the rest wrong either way."""
    pred, ref = logits.argmax(-1), ref_logits.argmax(-1)
    acc, ref_acc = _accuracy(logits, labels), _accuracy(ref_logits, labels)
    changed = pred != ref
    return {"accuracy": round(acc, 4), "accuracy_posts": len(labels), "delta_points": round(100 * (acc - ref_acc), 2),
            "counts": abs(100 * (acc - ref_acc)) <= COUNTS_WITHIN_POINTS,
            "agree_with_fp32": round(float((~changed).float().mean()), 4), "changed": int(changed.sum()),
            "fixed": int((changed & (pred == labels)).sum()), "broken": int((changed & (ref == labels)).sum())}


#: The optional rows of :func:`engine_rows` (the first four rows always run).
ENGINE_METHODS = ["hf-eager, naive batches", "hf-sdpa int8 (torch.ao quantize_dynamic), length-sorted",
                  "bertlib padding-free int8, length-sorted", "bertlib padding-free, prepacked weights, length-sorted",
                  BF16_ROW, "bertlib-sdpa + torch.compile, length-sorted",
                  "ONNX Runtime (bertlib's graph), length-sorted",
                  "ONNX Runtime + transformer optimizer, length-sorted",
                  "ONNX Runtime + transformer optimizer (HF's graph), length-sorted",
                  "ONNX Runtime + optimizer, int8 weights, length-sorted",
                  "OpenVINO (bertlib's graph), length-sorted", "CTranslate2, length-sorted",
                  "CTranslate2 int8, length-sorted"]
#: The columns :func:`markdown` shows of the engine rows.
ENGINE_COLUMNS = ["method", "posts_per_s", "posts_per_s_min", "posts_per_s_max", "speedup_vs_hf_naive", "speedup_min",
                  "speedup_max", "latency_ms_128", "accuracy", "accuracy_posts", "delta_points", "counts",
                  "prepare_s"]
#: The quick profile's optional rows (CI): bertlib's int8, prepacked and bf16 paths, one engine.
QUICK_ENGINE_METHODS = ["bertlib padding-free int8, length-sorted",
                        "bertlib padding-free, prepacked weights, length-sorted", BF16_ROW,
                        "ONNX Runtime + transformer optimizer, length-sorted"]


def _load() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def _hf_eager(model, label_names):
    from bertlib.tasks.export import to_hf_classifier

    hf = to_hf_classifier(model, label_names)
    return lambda ids, m: hf(input_ids=ids, attention_mask=m).logits


def _hf_int8(hf):
    """HF's classifier with ``torch.ao.quantization.quantize_dynamic`` on its ``nn.Linear`` layers (a copy)."""
    import copy

    from bertlib.perf import engines as E

    q = torch.ao.quantization.quantize_dynamic(copy.deepcopy(hf).cpu(), {torch.nn.Linear}, dtype=torch.qint8)
    return E.Engine("hf-sdpa int8", lambda ids, m: q(input_ids=ids, attention_mask=m).logits,
                    note="torch.ao.quantization.quantize_dynamic on every nn.Linear (the classifier layer too)")
