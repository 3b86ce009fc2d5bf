"""The engines people serve BERT with, each wrapped around the same fine-tuned classifier (appendix 14, issue 29).

Every ``make_*`` function takes an eval-mode :class:`~bertlib.tasks.classifier.BertClassifier` and returns a
:class:`Engine`: a
callable ``(input_ids, attention_mask) -> logits`` (``(batch, seq)`` int64 tensors in, ``(batch, C)`` float32
out) with the seconds its preparation took (export, conversion, compilation). Engines whose package is absent
raise :class:`EngineUnavailable` with a message saying what to install (``pip install -e '.[bench]'``).

- :func:`make_bertlib`: :func:`bertlib.bert_forward` (sdpa or padding-free) + the classifier layer;
- :func:`make_compiled`: the same function under ``torch.compile`` (inductor on CPU, dynamic shapes);
- :func:`make_int8`: the same function with every encoder ``Linear`` weight stored in int8
  (:class:`~bertlib.variants.fast_linear.Int8Linear`: PyTorch's dynamic quantization kernel, activations quantized per
  call);
- :func:`make_packed`: the same function (padding-free) with float32 weights prepacked for oneDNN and GELU applied
  inside the feed-forward's first product (:class:`~bertlib.variants.fast_linear.PackedLinear`);
- :func:`make_onnx` / :func:`make_ort`: bertlib's forward exported to ONNX, run by ONNX Runtime, with or without
  its transformer optimizer (``onnxruntime.transformers.optimizer``: attention, LayerNorm and GELU fusion);
- :func:`make_openvino`: the ONNX file compiled by OpenVINO for the CPU (float32);
- :func:`make_ctranslate2`: the classifier saved as Hugging Face ``BertModel``, converted by CTranslate2's
  ``TransformersConverter`` and run by its ``Encoder`` (pooler output), the classifier layer in PyTorch.

Every engine uses ``torch.get_num_threads()`` threads, so the rows compare like with like.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertlib.model.encoder import OUTPUTS_ONLY, bert_forward
from bertlib.model.runtime import autocast_for, bf16_supported
from bertlib.variants.fast_linear import pack_weights, quantize_weights


@contextlib.contextmanager
def quiet_export():
    """No warnings and no torch.onnx log lines inside the block: the exporter warns about things that do not matter
    here (torchvision absent, axis names merged), and text on stderr fails the book build. Chapter 14."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)

__all__ = [
    "Engine", "EngineUnavailable", "HFLogitsModule", "LogitsModule", "classifier_logits", "export_onnx",
    "make_bertlib", "make_compiled", "make_ctranslate2", "make_int8", "make_openvino", "make_ort", "make_packed",
    "require"
]


class EngineUnavailable(RuntimeError):
    """An engine's package is not installed (or cannot run this model): the benchmark skips its row."""


def require(module: str, pip_name: str | None = None):
    """Import ``module`` or raise :class:`EngineUnavailable` naming the package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EngineUnavailable(f"{pip_name or module} is not installed ({e}); pip install -e '.[bench]' adds "
                                "every engine") from None


@dataclass
class Engine:
    """``fn(input_ids, attention_mask) -> (batch, C)`` float32 logits, and what it cost to prepare."""

    name: str
    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    prepare_s: float = 0.0
    note: str = ""

    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.fn(input_ids, attention_mask)


def _weights(model) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    """The classifier's encoder weights (``BertModel`` names) and its last layer, detached."""
    sd = {k: v.detach() for k, v in model.bert.named_parameters()}
    return sd, model.classifier.weight.detach(), model.classifier.bias.detach()


def classifier_logits(sd, head_weight, head_bias, config, input_ids, attention_mask,
                      attn_implementation: str = "sdpa") -> torch.Tensor:
    """``W · pooler(bert_forward(...)) + b``: what :class:`~bertlib.tasks.classifier.BertClassifier` computes in eval
    mode, with the fast kernels (fused LayerNorm/GELU) and nothing kept but the outputs."""
    out = bert_forward(sd, config, input_ids, attention_mask, attn_implementation=attn_implementation, fused=True,
                       **OUTPUTS_ONLY, check=False)
    return F.linear(out.pooler_output, head_weight, head_bias)


def static_logits(sd, head_weight, head_bias, config, input_ids, attention_mask) -> torch.Tensor:
    """:func:`classifier_logits` (sdpa) as one graph for compilers and exporters: the same functions
    :func:`bertlib.bert_forward` calls (embeddings, encoder, pooler), minus its one shortcut that reads the data
    (an all-ones mask is dropped there; here it is always added, and adding zeros changes nothing)."""
    from bertlib.model.attention import extended_attention_mask
    from bertlib.model.embeddings import embeddings
    from bertlib.model.encoder import FAST, encoder
    from bertlib.model.options import ForwardOptions
    from bertlib.model.pooler import pooler

    options = ForwardOptions(**FAST, check=False)
    x = embeddings(sd, config, input_ids, None, options=options)
    hidden, _ = encoder(sd, config, x, extended_attention_mask(attention_mask, x.dtype), options=options)
    return F.linear(pooler(sd, config, hidden[-1]), head_weight, head_bias)


def make_bertlib(model, attn_implementation: str = "sdpa") -> Engine:
    """bertlib's forward pass as it is (``"sdpa"``, or ``"unpadded"``: the padding-free path)."""
    sd, w, b = _weights(model)
    config = model.config
    return Engine(f"bertlib {attn_implementation}",
                  lambda ids, m: classifier_logits(sd, w, b, config, ids, m, attn_implementation))


def make_compiled(model, attn_implementation: str = "sdpa", warmup: tuple[torch.Tensor, torch.Tensor] | None = None
                  ) -> Engine:
    """bertlib's forward pass under ``torch.compile`` (inductor; ``dynamic=True``: one graph for every batch and
    length). ``warmup`` (ids, mask) is run once here, so ``prepare_s`` includes the compilation."""
    sd, w, b = _weights(model)
    config = model.config

    def fn(ids, m):
        if attn_implementation == "sdpa":
            return static_logits(sd, w, b, config, ids, m)
        return classifier_logits(sd, w, b, config, ids, m, attn_implementation)

    compiled = torch.compile(fn, dynamic=True)
    t0 = time.perf_counter()
    if warmup is not None:
        with torch.inference_mode():
            compiled(*warmup)
    return Engine(f"bertlib {attn_implementation} + torch.compile", compiled, time.perf_counter() - t0,
                  "inductor (CPU): elementwise chains (bias+GELU, residual+LayerNorm, softmax) fused into generated "
                  "C++ loops; matmuls stay library calls")


def make_packed(model, attn_implementation: str = "unpadded") -> Engine:
    """bertlib's forward pass (float32) with its ``Linear`` weights prepacked for oneDNN and GELU applied inside the
    feed-forward's first product (:func:`pack_weights`)."""
    if not torch.backends.mkldnn.is_available():
        raise EngineUnavailable("this PyTorch build has no oneDNN (mkldnn) kernels")
    sd, w, b = _weights(model)
    t0 = time.perf_counter()
    config = model.config
    packed = pack_weights(sd, config)
    return Engine(f"bertlib {attn_implementation}, prepacked weights", lambda ids, m: classifier_logits(
        packed, w, b, config, ids, m, attn_implementation), time.perf_counter() - t0,
        "float32 weights reordered once for oneDNN (mkldnn._linear_pointwise); GELU applied inside the product")


def make_int8(model, attn_implementation: str = "sdpa") -> Engine:
    """bertlib's forward pass with int8 weights (:func:`quantize_weights`); the classifier layer stays float32."""
    if "quantized" not in dir(torch.ops) or not hasattr(torch.ops.quantized, "linear_dynamic"):
        raise EngineUnavailable("this PyTorch build has no quantized.linear_dynamic kernel")
    sd, w, b = _weights(model)
    t0 = time.perf_counter()
    q = quantize_weights(sd)
    config = model.config
    return Engine(f"bertlib {attn_implementation} int8", lambda ids, m: classifier_logits(
        q, w, b, config, ids, m, attn_implementation), time.perf_counter() - t0,
        "dynamic quantization: int8 weights (per row), activations quantized per call")


def make_bf16(model, attn_implementation: str = "unpadded") -> Engine:
    """bertlib's forward pass under bfloat16 autocast (:func:`bertlib.model.runtime.autocast_for`): the matrix
    products in
    bfloat16 (8 bits of mantissa, float32's range), LayerNorm, softmax and the logits in float32. Only where the CPU
    multiplies bfloat16 natively (:func:`bertlib.model.runtime.bf16_supported`); elsewhere the row is skipped."""
    if not bf16_supported("cpu"):
        raise EngineUnavailable("this CPU has no native bfloat16 matrix products (avx512_bf16 or AMX)")
    sd, w, b = _weights(model)
    config = model.config

    def fn(ids, m):
        with autocast_for("cpu"):
            return classifier_logits(sd, w, b, config, ids, m, attn_implementation).float()
    return Engine(f"bertlib {attn_implementation} bf16", fn,
                  note="bfloat16 autocast: float32 weights, matrix products in bfloat16 (oneDNN)")


class LogitsModule(nn.Module):
    """``(input_ids, attention_mask) -> logits`` as an ``nn.Module`` whose buffers are the classifier's weights:
    what ``torch.onnx.export`` traces (bertlib's own graph, SDPA attention)."""

    def __init__(self, model):
        super().__init__()
        sd, w, b = _weights(model)
        self.names = list(sd)
        for k, v in sd.items():
            self.register_buffer(k.replace(".", "__"), v.clone())
        self.register_buffer("head_weight", w.clone())
        self.register_buffer("head_bias", b.clone())
        self.config = model.config

    def forward(self, input_ids, attention_mask):
        sd = {k: getattr(self, k.replace(".", "__")) for k in self.names}
        return static_logits(sd, self.head_weight, self.head_bias, self.config, input_ids, attention_mask)


class HFLogitsModule(nn.Module):
    """``(input_ids, attention_mask) -> logits`` of a ``transformers`` classifier: what optimum's ONNX export
    traces (Hugging Face's graph, for comparison with bertlib's)."""

    def __init__(self, hf_model):
        super().__init__()
        self.hf_model = hf_model

    def forward(self, input_ids, attention_mask):
        return self.hf_model(input_ids=input_ids, attention_mask=attention_mask).logits


def export_onnx(model, path: str | Path, opset: int = 18, *, hf_model=None) -> float:
    """bertlib's forward + the classifier layer as an ONNX graph at ``path`` (batch and length dynamic), with
    PyTorch's ``torch.export``-based exporter; returns the seconds it took. With ``hf_model`` (``model``'s
    ``BertForSequenceClassification``, :func:`bertlib.tasks.export.to_hf_classifier`) the graph exported is Hugging
    Face's instead, as ``optimum`` would export it (optimum-onnx itself needs transformers < 4.58)."""
    require("onnx")
    require("onnxscript")
    if getattr(model.config, "is_decoder", False):
        raise EngineUnavailable("the ONNX export covers the bidirectional encoder only")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    module = (LogitsModule(model) if hf_model is None else HFLogitsModule(hf_model)).eval()
    ids = torch.randint(1000, 2000, (2, 16))
    mask = torch.ones_like(ids)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=model.config.max_position_embeddings)
    t0 = time.perf_counter()
    with torch.no_grad(), quiet_export():
        program = torch.onnx.export(module, (ids, mask), input_names=["input_ids", "attention_mask"],
                                    output_names=["logits"], opset_version=opset, dynamo=True, verbose=False,
                                    dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    with quiet_export():
        program.save(str(path))
    return time.perf_counter() - t0


def _ort_optimize(path: Path, config) -> tuple[Path, dict]:
    """ONNX Runtime's transformer optimizer on ``path`` (model_type ``bert``): the fused graph and the fused
    operators it counted (``Attention``, ``SkipLayerNormalization``, ``BiasGelu``...)."""
    from onnxruntime.transformers.optimizer import optimize_model

    opt = optimize_model(str(path), model_type="bert", num_heads=config.num_attention_heads,
                         hidden_size=config.hidden_size, opt_level=1)
    out = path.with_name(path.stem + "-ortopt.onnx")
    opt.save_model_to_file(str(out))
    return out, {k: v for k, v in opt.get_fused_operator_statistics().items() if v}


def make_ort(model, onnx_path: str | Path, optimize: bool, int8: bool = False) -> Engine:
    """ONNX Runtime (CPU) on the exported graph; ``optimize=True`` first runs its transformer optimizer;
    ``int8=True`` then quantizes its MatMul weights (``onnxruntime.quantization.quantize_dynamic``, int8 weights,
    activations quantized per call: ORT's counterpart of :func:`make_int8`)."""
    ort = require("onnxruntime")
    onnx_path = Path(onnx_path)
    t0 = time.perf_counter()
    note = "ORT's default graph optimizations only"
    if optimize:
        onnx_path, fused = _ort_optimize(onnx_path, model.config)
        note = "transformer optimizer fused: " + ", ".join(f"{k} x{v}" for k, v in fused.items())
    if int8:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        out = onnx_path.with_name(onnx_path.stem + "-int8.onnx")
        quantize_dynamic(str(onnx_path), str(out), weight_type=QuantType.QInt8, per_channel=True)
        onnx_path, note = out, note + "; int8 MatMul weights (quantize_dynamic, per channel)"
    so = ort.SessionOptions()
    so.intra_op_num_threads = torch.get_num_threads()
    so.inter_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])

    def fn(ids, m):
        out = session.run(["logits"], {"input_ids": ids.numpy(), "attention_mask": m.numpy()})[0]
        return torch.from_numpy(out)
    return Engine("ONNX Runtime" + (" + transformer optimizer" if optimize else "") + (" int8" if int8 else ""), fn,
                  time.perf_counter() - t0, note)


def make_openvino(model, onnx_path: str | Path) -> Engine:
    """OpenVINO (CPU plugin, float32 inference precision) on the exported ONNX graph."""
    ov = require("openvino")
    t0 = time.perf_counter()
    core = ov.Core()
    compiled = core.compile_model(ov.convert_model(str(onnx_path)), "CPU", {
        "INFERENCE_NUM_THREADS": torch.get_num_threads(), "INFERENCE_PRECISION_HINT": "f32",
        "PERFORMANCE_HINT": "LATENCY"})
    request = compiled.create_infer_request()

    def fn(ids, m):
        res = request.infer({"input_ids": ids.numpy(), "attention_mask": m.numpy()})
        return torch.from_numpy(res[compiled.output(0)].copy())
    return Engine("OpenVINO", fn, time.perf_counter() - t0, "convert_model(ONNX) -> compile_model(CPU, f32)")


def make_ctranslate2(model, tokenizer, workdir: str | Path, quantization: str | None = None) -> Engine:
    """CTranslate2's ``Encoder`` on the classifier's encoder (converted from a Hugging Face ``BertModel``
    directory); its pooler output goes through the classifier layer in PyTorch. ``quantization``: ``None``
    (float32) or ``"int8"``."""
    ct2 = require("ctranslate2")
    from bertlib.model.pretrained import Pretrained, to_hf_model

    workdir = Path(workdir)
    t0 = time.perf_counter()
    sd, w, b = _weights(model)
    # the converted model is kept, keyed by the weights: another classifier (another run) must not reuse it
    digest = hashlib.sha1(b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in sd.values()))
    hf_dir = workdir / f"hf-bertmodel-{digest.hexdigest()[:12]}"
    ct_dir = workdir / f"ct2-{quantization or 'float32'}-{digest.hexdigest()[:12]}"
    if not (ct_dir / "model.bin").exists():
        hf = to_hf_model(Pretrained(state_dict=sd, config=model.config, tokenizer=tokenizer, source="classifier"),
                         "eager")
        hf.config.architectures = ["BertModel"]
        hf.config.position_embedding_type = "absolute"  # CTranslate2's converter reads it (transformers 5 dropped it)
        hf.save_pretrained(hf_dir)
        tokenizer.save_pretrained(hf_dir)
        ct2.converters.TransformersConverter(str(hf_dir)).convert(str(ct_dir), quantization=quantization,
                                                                 force=True)
    encoder = ct2.Encoder(str(ct_dir), device="cpu", intra_threads=torch.get_num_threads(),
                          compute_type=quantization or "float32")

    def fn(ids, m):
        lengths = m.sum(1).tolist()
        batch = [row[:n] for row, n in zip(ids.tolist(), lengths, strict=True)]
        out = encoder.forward_batch(batch)
        if out.pooler_output is None:
            raise EngineUnavailable("CTranslate2 returned no pooler output for this model")
        return F.linear(torch.from_numpy(np.array(out.pooler_output)), w, b)
    return Engine("CTranslate2" + (f" {quantization}" if quantization else ""), fn, time.perf_counter() - t0,
                  "TransformersConverter(BertModel) -> Encoder.forward_batch (unpadded lists of ids)")

