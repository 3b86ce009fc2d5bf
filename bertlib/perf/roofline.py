"""A roofline model of this machine (appendix 14, issue 29): how fast can each operation of a forward pass be?

An operation needs ``flops`` arithmetic and moves ``bytes`` between memory and the cores. The machine does at most
``peak_flops`` per second and moves at most ``bandwidth`` bytes per second, so the operation takes at least
``max(flops / peak_flops, bytes / bandwidth)``. Its **arithmetic intensity** ``flops / bytes`` decides which bound
is the larger: above the **ridge point** ``peak_flops / bandwidth`` an operation is compute-bound, below it
memory-bound (Williams, Waterman and Patterson 2009).

- :func:`measure_machine`: ``peak_flops`` from a large float32 matmul, ``bandwidth`` from a large copy, and the int8
  matmul rate (PyTorch's dynamic-quantization kernel), each the best of a few rounds;
- :func:`layer_ops`: every operation of one encoder layer at ``(batch, seq)`` with its FLOPs and the bytes it
  must move at least (inputs, weights and outputs read or written once, float32);
- :func:`predict`: the roofline's time and bound for each;
- :func:`profile_layer_ops`: ``torch.profiler``'s self CPU time per operation kind of a real forward pass, grouped
  like :func:`layer_ops`, to check the prediction.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from dataclasses import dataclass

import torch

__all__ = ["KIND_OF_ATEN", "Machine", "Op", "int8_gain", "layer_ops", "measure_machine", "packed_gain", "predict",
           "profile_layer_ops"]


@dataclass
class Machine:
    peak_flops: float  # float32 FLOP/s of a large matmul
    bandwidth: float  # bytes/s of a large copy (read + write)
    int8_ops: float  # int8 multiply-adds x 2 per second of a large dynamic-quantized matmul
    threads: int

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which an operation is compute-bound."""
        return self.peak_flops / self.bandwidth


def _best_seconds(fn, rounds: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_machine(n: int = 1024, copy_mb: int = 256, rounds: int = 5) -> Machine:
    """The machine's float32 matmul peak (``n x n`` by ``n x n``, ``2 n^3`` FLOPs), its copy bandwidth (a
    ``copy_mb`` MB tensor read and written: ``2 x copy_mb`` MB moved) and its int8 matmul rate; best of ``rounds``."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    out = torch.empty(n, n)
    peak = 2 * n**3 / _best_seconds(lambda: torch.mm(a, b, out=out), rounds)
    src = torch.randn(copy_mb * 2**20 // 4, generator=g)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), rounds)
    scale = b.abs().amax(dim=1).double() / 127
    with warnings.catch_warnings():  # quantized tensors are deprecated in torch; their kernels are not yet
        warnings.simplefilter("ignore", UserWarning)
        q = torch.quantize_per_channel(b, scale, torch.zeros(n, dtype=torch.long), 0, torch.qint8)
    packed = torch.ops.quantized.linear_prepack(q, None)
    int8 = 2 * n**3 / _best_seconds(lambda: torch.ops.quantized.linear_dynamic(a, packed, reduce_range=False), rounds)
    return Machine(peak, bandwidth, int8, torch.get_num_threads())


@dataclass
class Op:
    name: str
    kind: str  # "matmul (weights)", "attention products", "softmax", "GELU", "LayerNorm + residual"
    flops: float
    bytes: float
    count: int = 1  # how many of it one layer runs

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes


def layer_ops(config, batch: int, seq: int, bytes_per_number: int = 4) -> list[Op]:
    """The operations of one encoder layer on ``(batch, seq)`` tokens, with their FLOPs and minimal bytes moved
    (float32: 4 bytes a number). Attention is counted as written out (scores stored, as eager attention does)."""
    n, hid, inter = batch * seq, config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    d = hid // heads
    w = bytes_per_number
    scores = batch * heads * seq * seq

    def dense(name, k, m, count=1):  # (n, k) @ (k, m) + bias
        return Op(name, "matmul (weights)", 2 * n * k * m, w * (n * k + k * m + m + n * m), count)

    return [
        dense("Q, K, V projections", hid, hid, 3),
        Op("scores Q K^T", "attention products", 2 * scores * d, w * (2 * batch * heads * seq * d + scores)),
        Op("softmax", "softmax", 5 * scores, w * 2 * scores),
        Op("probabilities x V", "attention products", 2 * scores * d, w * (scores + 2 * batch * heads * seq * d)),
        dense("attention output dense", hid, hid),
        Op("residual + LayerNorm", "LayerNorm + residual", 9 * n * hid, w * 3 * n * hid, 2),
        dense("feed-forward in", hid, inter),
        Op("GELU", "GELU", 8 * n * inter, w * 2 * n * inter),
        dense("feed-forward out", inter, hid),
    ]


def predict(ops: list[Op], machine: Machine) -> list[dict]:
    """For each op: intensity, the roofline's time (ms, all ``count`` of them) and its bound."""
    rows = []
    for op in ops:
        t_compute, t_memory = op.flops / machine.peak_flops, op.bytes / machine.bandwidth
        rows.append({"op": op.name, "kind": op.kind, "count": op.count, "mflops": round(op.count * op.flops / 1e6, 1),
                     "mbytes": round(op.count * op.bytes / 1e6, 2), "intensity": round(op.intensity, 1),
                     "bound": "compute" if op.intensity > machine.ridge else "memory",
                     "roofline_ms": round(op.count * max(t_compute, t_memory) * 1e3, 3)})
    return rows


#: Which :class:`Op` kind each aten operation's self time is charged to.
KIND_OF_ATEN = {
    "aten::addmm": "matmul (weights)", "aten::mm": "matmul (weights)",
    "aten::bmm": "attention products", "aten::baddbmm": "attention products",
    "aten::_softmax": "softmax", "aten::softmax": "softmax",
    "aten::gelu": "GELU",
    "aten::native_layer_norm": "LayerNorm + residual", "aten::add": "LayerNorm + residual",
    "aten::add_": "LayerNorm + residual",
}


@contextlib.contextmanager
def _c_stderr_silenced():
    """The profiler's C++ side logs "profiler_start/stop" lines straight to file descriptor 2, which a notebook
    shows as stderr (and the book build refuses): point descriptor 2 at /dev/null for the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def profile_layer_ops(fn, rounds: int = 3) -> dict[str, float]:
    """``torch.profiler``'s self CPU time (ms per call, the minimum over ``rounds`` profiled calls) of the aten
    operations of ``fn()`` grouped by :data:`KIND_OF_ATEN` kind; everything else is ``"other"``."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    best: dict[str, float] = {}
    for _ in range(rounds):
        with _c_stderr_silenced(), profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        kinds: dict[str, float] = {}
        for e in prof.key_averages():
            kind = KIND_OF_ATEN.get(e.key, "other")
            kinds[kind] = kinds.get(kind, 0.0) + e.self_cpu_time_total / 1e3
        for k, v in kinds.items():
            best[k] = min(best.get(k, float("inf")), v)
    return best


def _stored_weight_gain(m: int, k: int, n: int, store, rounds: int) -> float:
    """How many times faster ``F.linear`` runs an ``(m, k) @ (k, n)`` product with the weight stored by ``store``
    (:mod:`bertlib.variants.fast_linear`) than as a plain float32 tensor: best time of ``rounds`` each."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    stored = store(w)
    plain = _best_seconds(lambda: torch.nn.functional.linear(x, w), rounds)
    return plain / _best_seconds(lambda: torch.nn.functional.linear(x, stored), rounds)


def int8_gain(m: int, k: int, n: int, rounds: int = 5) -> float:
    """How many times faster an ``(m, k) @ (k, n)`` product runs with int8 weights (PyTorch's dynamic-quantization
    kernel, activations quantized per call: :class:`bertlib.variants.fast_linear.Int8Linear`) than in float32, at that
    shape: best time of ``rounds`` each."""
    from bertlib.variants.fast_linear import Int8Linear

    return _stored_weight_gain(m, k, n, lambda w: Int8Linear(w, None), rounds)


def packed_gain(m: int, k: int, n: int, rounds: int = 5) -> float:
    """How many times faster an ``(m, k) @ (k, n)`` float32 product runs with its weight prepacked for oneDNN
    (:class:`bertlib.variants.fast_linear.PackedLinear`) than through a plain ``F.linear``, at that shape: best time of
    ``rounds`` each. Appendix 14, *The engines people serve BERT with*."""
    from bertlib.variants.fast_linear import PackedLinear

    return _stored_weight_gain(m, k, n, PackedLinear, rounds)
