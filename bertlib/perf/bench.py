"""``python -m bertlib.perf.bench [--quick] [--out FILE.json]``: bertlib's forward pass timed against transformers.

Same inputs, one run; every implementation of a shape is timed in turn, round after round (interleaved, so a
machine that slows down mid-run slows all of them alike), after warm-up; the median is reported, and each ratio
is taken within a round and then the median over rounds. Sections:

- **grid**: rows ``model, impl, batch, seq, dtype, device, ms, tokens_per_s, peak_mem_mb, ratio_vs_hf_sdpa``
  (plus ``mfu`` for bf16/fp16 on a GPU). Implementations: ``hf-eager`` and ``hf-sdpa`` (``transformers.BertModel``
  with that ``attn_implementation``); ``bertlib-eager`` (chapter 5's batched heads, with LayerNorm and GELU as
  one PyTorch kernel each, the kernels HF's ``nn.LayerNorm`` and ``GELUActivation`` run: the like-for-like match
  of ``hf-eager``); ``bertlib-eager-formulas`` (the same with chapter 3's LayerNorm and chapter 6's GELU written
  out as elementwise operations, what the book derives); ``bertlib-sdpa`` (the fast path: fused attention + fused
  LayerNorm/GELU, the match of ``hf-sdpa``); ``bertlib-head-loop`` (chapter 4's per-head loop, at scale); on CUDA
  also ``bertlib-sdpa+compile``. Each row gives its time over ``hf-sdpa``'s and over ``hf-eager``'s.
- **workload**: 20 Newsgroups test posts: naive padded batches (dataset order) vs length-sorted batches vs
  bertlib's padding-free path (:mod:`bertlib.model.encoder`), in posts/s, with the [CLS] vectors checked equal. The
  methods take turns batch by batch, so a slowdown of the machine hits all of them alike.
- **engines** (issue 29): chapter 9's fine-tuned classifier (:func:`workload_classifier`, kept under ``_build/bench``)
  on 20 Newsgroups test posts through HF (eager, sdpa, ``torch.ao`` int8), bertlib (sdpa, padding-free, int8 weights,
  bfloat16 autocast, ``torch.compile``) and the engines of :mod:`bertlib.perf.engines` (ONNX Runtime with and without
  its
  transformer optimizer, OpenVINO, CTranslate2): posts/s with its min and max over rounds, paired speed-ups over HF's
  naive batches, the latency of one 128-token post, and test accuracy with its gap to fp32 bertlib (a row counts
  within 0.3 points; the full profile scores every row that changed a prediction again on all 7,532 test posts,
  ``--accuracy-posts``). bertlib's fastest float32 path prepacks its weights for oneDNN and applies GELU inside the
  product (:class:`bertlib.variants.fast_linear.PackedLinear`). ``--quick`` keeps int8, prepacked weights, bf16 and ONNX
  Runtime with its optimizer, on 64 posts. An engine whose package is absent is skipped with a message (``pip install
  -e '.[bench]'``). int8 uses ``torch.ops.quantized.linear_dynamic`` (the kernel of
  ``torch.ao.quantization.quantize_dynamic``): measured here faster than ``torch._int_mm`` with hand-written
  (de)quantization (89 vs 153 ms, fp32 368 ms, for a 4096x384 by 384x1536 product on one loaded core).
- **finetune**: training steps/s of ``bertlib.tasks.classifier.BertClassifier`` vs
``transformers.BertForSequenceClassification``
  with the same loop (AdamW, bf16 autocast on CUDA).
- **training**: the fine-tuning step on the ``cpu`` profile's batches against ``transformers.Trainer`` itself:
  chapter 9's padded step, the padding-free step and (full) ``torch.compile`` with its compile time and break-even
  step count, each in float32 and, where the device multiplies bfloat16 natively
  (:func:`bertlib.model.runtime.bf16_supported`), under bfloat16 autocast against ``Trainer(bf16=True)``; real tokens/s,
  paired speed-ups over ``Trainer`` at the same precision and over chapter 9's float32 step (min-max over rounds),
  and the bf16 step's loss and gradient error against float32 (:mod:`bertlib.perf.bench_training`).

Timing and memory are measured by :mod:`bertlib.perf.timing` (interleaved rounds, paired ratios, glibc's allocator kept
from handing memory back, peak memory by ``psutil``).

Model FLOPs utilisation uses ``2 * params + 4 * layers * seq * hidden`` FLOPs per token for the forward pass, with
``params`` the non-embedding parameters (an embedding lookup is a copy, not a matmul; Kaplan et al. 2020 count the
same way), so the figure is conservative.
Used by appendix 14, *Making it fast*.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm.auto import trange
from transformers import BertConfig

from bertlib.data.batches import length_sorted_batches
from bertlib.data.files import check_output
from bertlib.model.encoder import OUTPUTS_ONLY, bert_forward
from bertlib.model.pretrained import Pretrained, load_pretrained, to_hf_model
from bertlib.model.runtime import configure, progress_enabled, seeded

# The engines section lives in bench_engines; chapter 14 and the tests read its names from here.
from bertlib.perf.bench_engines import (
    ENGINE_COLUMNS,
    QUICK_ENGINE_METHODS,
    EngineSettings,
    _load,
    engine_rows,
    padded_batches,
    probe_classifier,
    workload_classifier,
)
from bertlib.perf.timing import (
    keep_freed_memory,
    markdown,
    paired_ratio,
    peak_memory_mb,
    time_interleaved,
    time_rounds,
    timed,
)
from bertlib.variants.fast_linear import pack_weights

# The timing functions chapter 14 and the tests read as bertlib.perf.bench.X (defined in bertlib.perf.timing).
__all__ = [
    "Row", "finetune_rows", "forward_flops_per_token", "grid_rows", "main", "matmul_params",
    "outputs_only", "workload_rows"
]

#: Dense bf16 tensor-core peak (TFLOP/s, without sparsity) by GPU name, for model FLOPs utilisation.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0, "A10": 125.0}


@dataclass
class Row:
    model: str
    impl: str
    batch: int
    seq: int
    dtype: str
    device: str
    ms: float
    tokens_per_s: float
    peak_mem_mb: float | None
    ratio_vs_hf_sdpa: float | None = None
    ratio_vs_hf_eager: float | None = None
    mfu: float | None = None


def random_bert_base(device: torch.device, tokenizer) -> Pretrained:
    """A ``bert-base``-shaped model (12 layers, 768 hidden, 12 heads, 30522 vocab) with random weights."""
    from transformers import BertModel

    config = BertConfig()  # the defaults are bert-base's shape
    with seeded(0):
        model = BertModel(config)
    sd = {k: v.detach().to(device) for k, v in model.state_dict().items() if "position_ids" not in k}
    return Pretrained(state_dict=sd, config=config, tokenizer=tokenizer, source="random bert-base shape")


def matmul_params(state_dict) -> int:
    """Parameters that take part in matmuls: all but the embedding tables (their lookups are copies)."""
    return sum(v.numel() for k, v in state_dict.items() if not k.startswith("embeddings."))


def forward_flops_per_token(config: BertConfig, n_params: int, seq: int) -> float:
    """``2 * params + 4 * layers * seq * hidden``: matmul FLOPs per token of the forward pass."""
    return 2 * n_params + 4 * config.num_hidden_layers * seq * config.hidden_size


def outputs_only(*args, **kwargs):
    """:func:`bertlib.bert_forward` keeping only the outputs, as ``transformers.BertModel`` does by default (no
    hidden state per layer, no attention probabilities) and, like it, checking nothing (``check=False``): the
    like-for-like comparison."""
    return bert_forward(*args, **OUTPUTS_ONLY, check=False, **kwargs)


def head_loop_forward(sd, config, input_ids, attention_mask):
    """Chapter 4's per-head loop run through every layer: ``bert_forward(..., attn_implementation="head_loop")``
    (only attention differs; the formulas as written, so its match is ``bertlib-eager-formulas``)."""
    return outputs_only(sd, config, input_ids, attention_mask, attn_implementation="head_loop").last_hidden_state


def gpu_peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)


def grid_rows(name: str, pt: Pretrained, device: torch.device, shapes, dtypes, repeats: int,
              head_loop: bool, compile_: bool) -> list[Row]:
    """Time every implementation on random ids of each ``(batch, seq)`` shape."""
    config, sd = pt.config, pt.state_dict
    n_params = matmul_params(sd)
    hf = {impl: to_hf_model(pt, impl) for impl in ("eager", "sdpa")}
    peak_tflops = gpu_peak_tflops(device)
    compiled = torch.compile(outputs_only, dynamic=False) if compile_ and device.type == "cuda" else None
    # bertlib's float32 weights prepacked for oneDNN, GELU inside the product (CPU only: oneDNN's kernels)
    packed = pack_weights(sd, config) if device.type == "cpu" and torch.backends.mkldnn.is_available() else None

    def run(dtype, fn, *args, **kwargs):
        """``fn(*args, **kwargs)`` under inference mode and (below float32) autocast to ``dtype``, as a thunk."""
        def call():
            with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                return fn(*args, **kwargs)
        return call

    rows = []
    for batch, seq in shapes:
        g = torch.Generator().manual_seed(batch * 1000 + seq)
        ids = torch.randint(min(1000, config.vocab_size // 2), config.vocab_size, (batch, seq), generator=g).to(device)
        mask = torch.ones_like(ids)
        for dtype_name in dtypes:
            dtype = getattr(torch, dtype_name)
            impls = {
                "hf-eager": run(dtype, hf["eager"], input_ids=ids, attention_mask=mask),
                "hf-sdpa": run(dtype, hf["sdpa"], input_ids=ids, attention_mask=mask),
                "bertlib-eager": run(dtype, outputs_only, sd, config, ids, mask, fused=True),
                "bertlib-eager-formulas": run(dtype, outputs_only, sd, config, ids, mask),
                "bertlib-sdpa": run(dtype, outputs_only, sd, config, ids, mask, attn_implementation="sdpa", fused=True),
            }
            if packed is not None and dtype == torch.float32:
                impls["bertlib-sdpa-prepacked"] = run(dtype, outputs_only, packed, config, ids, mask,
                                                      attn_implementation="sdpa", fused=True)
            if head_loop:
                impls["bertlib-head-loop"] = run(dtype, head_loop_forward, sd, config, ids, mask)
            if compiled is not None:
                impls["bertlib-sdpa+compile"] = run(dtype, compiled, sd, config, ids, mask,
                                                    attn_implementation="sdpa", fused=True)
            rounds = time_rounds(impls, device, repeats)
            ms = {impl: statistics.median(t) for impl, t in rounds.items()}
            for impl, fn in impls.items():
                flops = forward_flops_per_token(config, n_params, seq) * batch * seq
                mfu = (flops / (ms[impl] / 1e3) / (peak_tflops * 1e12)
                       if peak_tflops and dtype != torch.float32 else None)
                rows.append(Row(name, impl, batch, seq, dtype_name, str(device), round(ms[impl], 3),
                                round(batch * seq / (ms[impl] / 1e3)), round(peak_memory_mb(fn, device), 1),
                                ratio_vs_hf_sdpa=round(paired_ratio(rounds, impl, "hf-sdpa"), 3),
                                ratio_vs_hf_eager=round(paired_ratio(rounds, impl, "hf-eager"), 3),
                                mfu=None if mfu is None else round(mfu, 4)))
    return rows


def workload_rows(pt: Pretrained, device: torch.device, n_posts: int | None, max_length: int, batch_size: int,
                  dtype: torch.dtype = torch.float32) -> list[dict]:
    """20 Newsgroups test posts, ``[CLS]`` vectors of every post: posts/s of each batching strategy."""
    from bertlib.data.corpus import load_20newsgroups

    posts = load_20newsgroups("test").data[:n_posts]
    enc = pt.tokenizer(posts, truncation=True, max_length=max_length)["input_ids"]
    hf = to_hf_model(pt, "sdpa")
    sd, config, pad = pt.state_dict, pt.config, pt.tokenizer.pad_token_id

    def cls_of(fn):
        return lambda ids, m: fn(ids, m).last_hidden_state[:, 0]

    lengths = [len(e) for e in enc]
    naive = [list(range(i, min(i + batch_size, len(enc)))) for i in range(0, len(enc), batch_size)]
    by_length = length_sorted_batches(lengths, batch_size)
    hf_fn = cls_of(lambda ids, m: hf(input_ids=ids, attention_mask=m))
    fast_fn = cls_of(lambda ids, m: outputs_only(sd, config, ids, m, attn_implementation="sdpa", fused=True))
    unpadded_fn = cls_of(lambda ids, m: outputs_only(sd, config, ids, m, attn_implementation="unpadded", fused=True))
    methods = {
        "hf-sdpa, naive batches": (naive, hf_fn),
        "hf-sdpa, length-sorted": (by_length, hf_fn),
        "bertlib-sdpa, naive batches": (naive, fast_fn),
        "bertlib-sdpa, length-sorted": (by_length, fast_fn),
        "bertlib padding-free, naive order": (naive, unpadded_fn),
        "bertlib padding-free, length-sorted": (by_length, unpadded_fn),
    }
    if device.type == "cpu":
        keep_freed_memory()
    batches = {name: list(padded_batches(enc, order, pad, device)) for name, (order, _) in methods.items()}
    cls = {name: torch.empty(len(enc), config.hidden_size, device=device) for name in methods}
    seconds = dict.fromkeys(methods, 0.0)
    with torch.inference_mode(), torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
        longest = np.argsort(lengths, kind="stable")[-batch_size:]
        _, ids, mask = next(padded_batches(enc, [longest], pad, device))
        for _, fn in methods.values():  # warm-up on the longest posts
            fn(ids, mask)
        n_batches = len(batches["hf-sdpa, naive batches"])
        for i in trange(n_batches, desc="20news batches, every method in turn",
                        leave=False, disable=not progress_enabled()):
            for name, (_, fn) in methods.items():
                idx, ids, mask = batches[name][i]
                out, spent = timed(fn, ids, mask, device=device)
                seconds[name] += spent
                cls[name][idx] = out.float()
    n_tokens = sum(len(e) for e in enc)
    ref = cls[next(iter(methods))]
    out = [{"workload": f"20news test, {len(enc)} posts, max {max_length} tokens", "method": name,
            "dtype": str(dtype).removeprefix("torch."), "device": str(device),
            "seconds": round(seconds[name], 3), "posts_per_s": round(len(enc) / seconds[name], 1),
            "real_tokens_per_s": round(n_tokens / seconds[name]),
            "max_abs_diff_cls_vs_hf_naive": float((cls[name] - ref).abs().max())} for name in methods]
    base = out[0]["posts_per_s"]
    for r in out:
        r["speedup_vs_hf_naive"] = round(r["posts_per_s"] / base, 2)
    return out


#: Where ``python -m bertlib.perf.bench`` and chapter 14 keep the fine-tuned classifier of the engine rows (reused).
def finetune_rows(pt: Pretrained, device: torch.device, batch: int, seq: int, steps: int,
                  num_labels: int = 20) -> list[dict]:
    """Training steps/s of ``BertClassifier`` as chapter 9's trainer builds it (SDPA, fused LayerNorm/GELU) vs
    ``BertForSequenceClassification``: the same loop and inputs, each with ``Trainer``'s default optimizer (fused
    AdamW)."""
    from transformers import BertForSequenceClassification

    from bertlib.tasks.classifier import BertClassifier

    config = pt.config
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, config.vocab_size, (batch, seq), generator=g).to(device)
    mask = torch.ones_like(ids)
    labels = torch.randint(0, num_labels, (batch,), generator=g).to(device)
    ours = BertClassifier(pt.state_dict, config, num_labels, attn_implementation="sdpa", fused=True).to(device)
    hf_config = BertConfig.from_dict({**config.to_dict(), "num_labels": num_labels})
    hf_config._attn_implementation = "sdpa"
    theirs = BertForSequenceClassification(hf_config).to(device)
    theirs.bert.load_state_dict(pt.state_dict, strict=False)
    bf16 = device.type == "cuda"

    def step_fn(model, logits_of):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
        model.train()

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = torch.nn.functional.cross_entropy(logits_of(model).float(), labels)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return step

    fns = {
        "bertlib BertClassifier (sdpa, fused)": step_fn(ours, lambda m: m(ids, mask)),
        "hf BertForSequenceClassification (sdpa)": step_fn(theirs,
                                                           lambda m: m(input_ids=ids, attention_mask=mask).logits),
    }
    ms = time_interleaved(fns, device, steps)
    base = ms["hf BertForSequenceClassification (sdpa)"]
    return [{"model": pt.source, "impl": name, "batch": batch, "seq": seq, "device": str(device),
             "dtype": "bfloat16 autocast" if bf16 else "float32", "ms_per_step": round(v, 2),
             "samples_per_s": round(batch / (v / 1e3), 1), "speedup_vs_hf": round(base / v, 3)}
            for name, v in ms.items()]


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse bad counts and an unwritable ``--out`` before any model or data is loaded (``parser.error``: the
    usage, the problem and exit status 2)."""
    for name in ("repeats", "engine_rounds"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)} "
                         "(leave it out for the default).")
    for name in ("posts", "engine_posts", "accuracy_posts"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 (all test posts) or a positive count, got "
                         f"{getattr(args, name)} (leave it out for the default).")
    if args.out:
        try:
            check_output(args.out, "--out")
        except ValueError as err:
            parser.error(str(err))


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m bertlib.perf.bench`` (``bertlib-bench``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a small CPU grid for CI (a few minutes)")
    parser.add_argument("--out", default=None, help="write every table as JSON")
    parser.add_argument("--no-workload", action="store_true", help="skip the 20 Newsgroups workload")
    parser.add_argument("--no-finetune", action="store_true", help="skip the training-step comparison")
    parser.add_argument("--no-training", action="store_true",
                        help="skip the fine-tuning step against transformers.Trainer on the cpu profile's batches")
    parser.add_argument("--no-engines", action="store_true", help="skip the engines on the fine-tuned classifier")
    parser.add_argument("--engine-posts", type=int, default=None,
                        help="engines: the first N test posts (default: 64 at 256 tokens quick, 512 at 512 otherwise; "
                             "0: all 7,532)")
    parser.add_argument("--accuracy-posts", type=int, default=None,
                        help="engines: score the rows that changed a prediction again on the first N test posts "
                             "(default: none quick, all otherwise; 0: all 7,532)")
    parser.add_argument("--probe", action="store_true",
                        help="engines: a linear probe on the pretrained encoder instead of the fine-tuned classifier")
    parser.add_argument("--engine-rounds", type=int, default=None,
                        help="engines: rounds over the posts, at least 1 (default: 2 quick, 3)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timing rounds, at least 1 (default: 5 quick, 7 CPU, 20 GPU)")
    parser.add_argument("--posts", type=int, default=None,
                        help="workload: the first N test posts at 512 tokens (default: 128 quick, all otherwise; "
                             "0: all 7,532)")
    parser.epilog = ("Counts of posts: left out means the default shown, 0 means all 7,532 test posts; counts of "
                     "rounds must be at least 1. Every value and --out are checked before anything is loaded.")
    return parser


def _resolve(args: argparse.Namespace, cuda: bool) -> argparse.Namespace:
    """``args`` with what the profile (``--quick``, or the full grid on CPU or CUDA) sets: ``cuda``, the grid's
    ``shapes`` (``base_shapes`` for the bert-base shape), ``dtypes`` and ``repeats``, the workload's ``n_posts``
    (None: all), ``max_len`` and ``wl_batch``, and the training-step comparison's ``ft`` = (batch, seq, steps)."""
    args.cuda = cuda
    if args.quick:
        args.shapes, args.base_shapes, args.dtypes, repeats = [(1, 128), (32, 128)], [(1, 128)], ["float32"], 5
        n_posts, args.max_len, args.wl_batch, args.ft = 128, 512, 32, (8, 128, 3)
    else:
        args.shapes = args.base_shapes = [(1, 128), (32, 128), (8, 512)] + ([(32, 512)] if cuda else [])
        args.dtypes = ["float32", "bfloat16", "float16"] if cuda else ["float32"]
        repeats, n_posts, args.max_len, args.wl_batch = (20 if cuda else 7), None, 512, 32
        args.ft = (32, 512, 10) if cuda else (16, 128, 5)
    args.repeats = args.repeats or repeats
    args.n_posts = (args.posts if args.posts is not None else n_posts) or None  # 0: all, as --engine-posts
    return args


def _grid_section(minilm: Pretrained, device: torch.device, args: argparse.Namespace) -> list[dict]:
    """The grid: all-MiniLM-L6-v2 and a random model of bert-base's shape, each shape and dtype (:func:`grid_rows`)."""
    rows = grid_rows("all-MiniLM-L6-v2", minilm, device, args.shapes, args.dtypes, args.repeats, head_loop=True,
                     compile_=not args.quick)
    rows += grid_rows("bert-base shape (random)", random_bert_base(device, minilm.tokenizer), device,
                      args.base_shapes, args.dtypes, args.repeats, head_loop=False, compile_=not args.quick)
    rows = [asdict(r) for r in rows]
    print(markdown(rows))
    return rows


def _workload_section(minilm: Pretrained, device: torch.device, args: argparse.Namespace) -> list[dict]:
    """The 20 Newsgroups workload (:func:`workload_rows`), again under bfloat16 on CUDA."""
    rows = workload_rows(minilm, device, args.n_posts, args.max_len, args.wl_batch)
    if args.cuda:
        rows += workload_rows(minilm, device, args.n_posts, args.max_len, args.wl_batch, dtype=torch.bfloat16)
    print()
    print(markdown(rows))
    return rows


def _engines_section(minilm: Pretrained, device: torch.device, args: argparse.Namespace) -> dict:
    """The engines on chapter 9's classifier (``--probe``: a linear probe), :func:`engine_rows`."""
    clf, label_names, info = (probe_classifier if args.probe else workload_classifier)(minilm, device)
    print(f"bench: classifier {info}")
    quick_posts, full_posts = 64, 512
    n = args.engine_posts if args.engine_posts is not None else (quick_posts if args.quick else full_posts)
    settings = EngineSettings(
        n_posts=n or None, max_length=256 if args.quick else 512, batch_size=args.wl_batch,
        rounds=args.engine_rounds or (2 if args.quick else 3), engines=QUICK_ENGINE_METHODS if args.quick else None,
        accuracy_posts=args.accuracy_posts if args.accuracy_posts is not None or args.quick else 0)
    run = engine_rows(clf, minilm.tokenizer, label_names, device, settings)
    run["classifier"] = info
    print()
    print(markdown(run["rows"], ENGINE_COLUMNS))
    return run


def _finetune_section(minilm: Pretrained, device: torch.device, args: argparse.Namespace) -> list[dict]:
    """Training steps/s of bertlib's classifier against HF's (:func:`finetune_rows`; bert-base's shape on CUDA)."""
    model = random_bert_base(device, minilm.tokenizer) if args.cuda and not args.quick else minilm
    rows = finetune_rows(model, device, *args.ft)
    print()
    print(markdown(rows))
    return rows


def _training_section(minilm: Pretrained, device: torch.device, args: argparse.Namespace) -> dict:
    """The fine-tuning step against ``transformers.Trainer`` on the ``cpu`` profile's batches, and the bf16 step's
    error (:mod:`bertlib.perf.bench_training`)."""
    from bertlib.perf.bench_training import TRAIN_COLUMNS, bf16_step_error, cpu_profile_batches, training_rows

    batch, rounds, steps = (8, 2, 3) if args.quick else (32, 3, 4)
    batches = cpu_profile_batches(minilm.tokenizer, rounds * steps, batch, min(128, minilm.max_length))
    run = training_rows(minilm, device, batches, rounds, steps, compile_=not args.quick)
    run["bf16_error"] = bf16_step_error(minilm, batches[:rounds], 20)
    run["setup"]["load_average"] = _load()
    print()
    print(markdown(run["rows"], TRAIN_COLUMNS))
    err = run["bf16_error"]
    print(f"bf16 step against float32 (largest over {rounds} batches): loss {err['loss_rel']:.2e}, "
          f"gradient {err['grad_rel']:.2e} relative, cosine {err['grad_cos']:.5f}")
    return run


#: The sections after the grid, in order, each skipped by ``--no-<name>``.
SECTIONS = {"workload": _workload_section, "engines": _engines_section, "finetune": _finetune_section,
            "training": _training_section}


def main(argv: list[str] | None = None) -> dict:
    """``python -m bertlib.perf.bench``: every section the arguments ask for, printed as tables; returns them (and
    writes them to ``--out`` as JSON). The arguments are checked before anything is loaded."""
    parser = _parser()
    args = parser.parse_args(argv)
    check_args(parser, args)
    device = configure(verbose=True).device
    args = _resolve(args, device.type == "cuda")
    print(f"bench: {'quick' if args.quick else 'full'} grid, {args.repeats} interleaved rounds, device={device}")
    minilm = load_pretrained(device=device)
    result = {"grid": _grid_section(minilm, device, args)}
    for name, section in SECTIONS.items():
        if not getattr(args, f"no_{name}"):
            result[name] = section(minilm, device, args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"bench: wrote {args.out}")
    return result


def cli() -> int:
    """The ``bertlib-bench`` command (``[project.scripts]``): :func:`main` (which returns its tables), exit 0."""
    main()
    return 0


if __name__ == "__main__":
    main()
