"""``Linear`` weights stored for a faster kernel (appendix 14, *The engines people serve BERT with*, issue 29).

bertlib's functions call ``F.linear(x, state_dict[name], ...)``. A state dict holding one of these objects instead
of a weight tensor makes that call run another kernel (``__torch_function__`` is how PyTorch lets a type take over
an operation), so bertlib's own forward pass runs unchanged around it:

- :class:`Int8Linear` (:func:`quantize_weights`): int8 weights, activations quantized per call (dynamic quantization);
- :class:`PackedLinear` (:func:`pack_weights`): float32 weights reordered once for oneDNN, GELU applied inside the
  feed-forward's first product.

:mod:`bertlib.perf.engines` wraps each in an engine (``make_int8``, ``make_packed``).
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

__all__ = ["ONEDNN_ACTIVATIONS", "Int8Linear", "PackedLinear", "pack_weights", "quantize_weights"]


class Int8Linear:
    """A ``Linear`` weight stored in int8 (one scale per output row) for ``F.linear``: any ``F.linear(x, w, b)``
    with ``w`` an ``Int8Linear`` runs PyTorch's dynamic-quantization kernel (``torch.ops.quantized.linear_dynamic``,
    fbgemm/oneDNN): ``x`` is quantized to 8 bits per call, the product accumulates in int32 and is scaled back to
    float32. The functions of bertlib call ``F.linear(x, state_dict[name], ...)``, so a state dict holding these
    objects runs bertlib's own forward pass in int8 (``__torch_function__`` is how PyTorch lets a type take over an
    operation)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        w = weight.detach().float().contiguous()
        scales = w.abs().amax(dim=1).clamp(min=1e-8) / 127.0
        zeros = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():  # quantized tensors are deprecated in torch; their kernels are not yet
            warnings.simplefilter("ignore", UserWarning)
            q = torch.quantize_per_channel(w, scales.double(), zeros, 0, torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float())
        self.shape, self.dtype, self.device = weight.shape, weight.dtype, weight.device
        self.nbytes = w.numel()  # one byte per weight

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w = args[0], args[1]
            # the bias was packed with the weight (the bias argument is the Int8Linear's own bias)
            return torch.ops.quantized.linear_dynamic(x.contiguous(), w.packed, reduce_range=False)
        raise TypeError(f"Int8Linear supports F.linear only, not {func}")


class _PackedBias:
    """Stands in for a bias packed into its :class:`Int8Linear` (``F.linear`` receives it and ignores it)."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return Int8Linear.__torch_function__(func, types, args, kwargs)


def _is_linear_weight(name: str, w: torch.Tensor) -> bool:
    """Whether ``name`` is a ``Linear`` weight of the encoder or the pooler (what bertlib passes to ``F.linear``);
    the embedding tables are 2-D too, but they are looked up, not multiplied."""
    return w.dim() == 2 and name.endswith(".weight") and name.startswith(("encoder.", "pooler."))


def quantize_weights(sd: dict[str, torch.Tensor]) -> dict:
    """``sd`` with every encoder and pooler ``Linear`` weight replaced by an :class:`Int8Linear` (its bias packed
    in); embeddings and LayerNorms stay float32."""
    out = dict(sd)
    for name, w in sd.items():
        if _is_linear_weight(name, w):
            bias = name.removesuffix(".weight") + ".bias"
            out[name] = Int8Linear(w, sd.get(bias))
            if bias in sd:
                out[bias] = _PackedBias()
    return out


#: ``config.hidden_act`` -> the post-op oneDNN applies inside the product: ``(attr, scalars, algorithm)``.
ONEDNN_ACTIVATIONS = {"gelu": ("gelu", [], "none"), "gelu_new": ("gelu", [], "tanh"),
                      "gelu_pytorch_tanh": ("gelu", [], "tanh"), "relu": ("relu", [], "")}


class PackedLinear:
    """A float32 ``Linear`` weight reordered once into the blocked layout of oneDNN's matrix kernel
    (``mkldnn._reorder_linear_weight``): any ``F.linear(x, w, b)`` with ``w`` a ``PackedLinear`` runs
    ``torch.ops.mkldnn._linear_pointwise`` on it. Two things change against a plain float32 ``F.linear``, which
    calls the BLAS ``sgemm`` (MKL here) and lets it copy blocks of ``W`` inside every call: the library, and that
    copy, now done once. The product is the same to float32 rounding. Inductor's ``freezing`` and OpenVINO also
    prepare their weights at load time. With ``activation`` (a ``config.hidden_act`` in :data:`ONEDNN_ACTIVATIONS`)
    the kernel also applies that activation to each block of the result before writing it out, so ``F.linear``
    returns ``act(x W^T + b)``: :func:`bertlib.feed_forward` then skips its own ``act``. Inference only, on the CPU,
    in eager mode (the oneDNN op has no gradient)."""

    def __init__(self, weight: torch.Tensor, activation: str | None = None):
        if not torch.backends.mkldnn.is_available():
            raise RuntimeError("this PyTorch build has no oneDNN (mkldnn) kernels; use the weights as they are")
        if weight.device.type != "cpu":
            raise ValueError(f"PackedLinear is for the CPU (oneDNN); this weight is on {weight.device}")
        if activation is not None and activation not in ONEDNN_ACTIVATIONS:
            raise ValueError(f"bertlib applies {sorted(ONEDNN_ACTIVATIONS)} inside the product, not {activation!r}; "
                             "pass activation=None")
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().float().contiguous(), None)
        self.activation = activation
        self.post_op = ONEDNN_ACTIVATIONS[activation] if activation else ("none", [], "")
        self.shape, self.dtype, self.device = weight.shape, torch.float32, weight.device

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is not F.linear:
            raise TypeError(f"PackedLinear supports F.linear only, not {func}")
        params = dict(zip(("input", "weight", "bias"), args, strict=False)) | (kwargs or {})
        x, w = params["input"], params["weight"]
        if x.dtype != torch.float32:
            raise TypeError(f"PackedLinear multiplies float32 inputs, not {x.dtype}: run it outside autocast")
        return torch.ops.mkldnn._linear_pointwise(x, w.packed, params.get("bias"), *w.post_op)


def pack_weights(sd: dict[str, torch.Tensor], config=None) -> dict:
    """``sd`` with every ``Linear`` weight of the encoder and the pooler (``encoder.*``, ``pooler.*``) replaced by a
    :class:`PackedLinear` (float32). Given ``config``, each feed-forward's first weight also applies
    ``config.hidden_act`` inside its product (when it is one of :data:`ONEDNN_ACTIVATIONS`)."""
    act = getattr(config, "hidden_act", None)
    act = act if act in ONEDNN_ACTIVATIONS else None
    return {name: PackedLinear(w, act if name.endswith("intermediate.dense.weight") else None)
            if _is_linear_weight(name, w) else w
            for name, w in sd.items()}
