"""One encoder layer (chapter 6, *The encoder layer*); mirrors HF ``BertSelfOutput``, ``BertIntermediate``,
``BertOutput`` and ``BertLayer``."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import BertConfig

from bertlib.model.layer_norm import layer_norm
from bertlib.model.multi_head import self_attention
from bertlib.model.options import DEFAULT_OPTIONS, ForwardOptions


def gelu(x: torch.Tensor) -> torch.Tensor:
    """Exact GELU, ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))`` (Hendrycks & Gimpel, 2016); BERT's ``"gelu"``."""
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """The tanh approximation of GELU (``"gelu_new"`` in HF, used by GPT-2)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


#: ``config.hidden_act`` → function, for the activations BERT checkpoints use.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": gelu,
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "relu": torch.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
}


#: The same functions as single PyTorch kernels (appendix 14, *Making it fast*).
FUSED_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    **ACTIVATIONS,
    "gelu": F.gelu,
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
}


def activation(name: str, *, fused: bool = False) -> Callable[[torch.Tensor], torch.Tensor]:
    """The function named by ``config.hidden_act`` (``fused=True``: its one-kernel PyTorch twin).
    Defined in chapter 6, *The encoder layer*."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act={name!r} is not supported; use one of {sorted(ACTIVATIONS)}.")
    return (FUSED_ACTIVATIONS if fused else ACTIVATIONS)[name]


def attention_output(state_dict: Mapping[str, Tensor], config: BertConfig, context: Tensor, input_tensor: Tensor, *,
                     layer: int = 0, options: ForwardOptions = DEFAULT_OPTIONS) -> Tensor:
    """``LayerNorm(input_tensor + Dropout(context W_O^T + b_O))``: mix the heads, add the residual, normalise.

    ``context`` (concatenated heads) and ``input_tensor`` (the layer's input): ``(batch, seq, hidden)``. Of the
    ``options`` (:class:`bertlib.model.options.ForwardOptions`) it reads ``training`` (dropout) and ``fused``.
    Defined in chapter 6, *The encoder layer* (HF ``BertSelfOutput``).
    """
    p = f"encoder.layer.{layer}.attention.output."
    h = F.linear(context, state_dict[p + "dense.weight"], state_dict[p + "dense.bias"])
    h = F.dropout(h, config.hidden_dropout_prob, options.training)
    return layer_norm(h + input_tensor, state_dict[p + "LayerNorm.weight"], state_dict[p + "LayerNorm.bias"],
                      config.layer_norm_eps, fused=options.fused)


def feed_forward(state_dict: Mapping[str, Tensor], config: BertConfig, attention_out: Tensor, *, layer: int = 0,
                 options: ForwardOptions = DEFAULT_OPTIONS) -> Tensor:
    """``LayerNorm(x + Dropout(act(x W_1^T + b_1) W_2^T + b_2))``, applied to every token independently.

    ``attention_out``: ``(batch, seq, hidden)``; the middle is ``(batch, seq, intermediate)``. Of the ``options``
    it reads ``training`` (dropout) and ``fused`` (the activation and LayerNorm as single kernels).
    Defined in chapter 6, *The encoder layer* (HF ``BertIntermediate`` + ``BertOutput``).
    """
    p = f"encoder.layer.{layer}."
    w1, b1 = state_dict[p + "intermediate.dense.weight"], state_dict[p + "intermediate.dense.bias"]
    h = F.linear(attention_out, w1, b1)
    applied = getattr(w1, "activation", None)  # a prepacked weight may apply it inside the product (appendix 14)
    if applied is None:
        h = activation(config.hidden_act, fused=options.fused)(h)
    elif applied != config.hidden_act:
        raise ValueError(f"layer {layer}'s feed-forward weight applies {applied!r} but config.hidden_act is "
                         f"{config.hidden_act!r}; pack the weights with this config "
                         "(bertlib.variants.fast_linear.pack_weights)")
    h = F.linear(h, state_dict[p + "output.dense.weight"], state_dict[p + "output.dense.bias"])
    h = F.dropout(h, config.hidden_dropout_prob, options.training)
    gamma, beta = state_dict[p + "output.LayerNorm.weight"], state_dict[p + "output.LayerNorm.bias"]
    return layer_norm(h + attention_out, gamma, beta, config.layer_norm_eps, fused=options.fused)


def encoder_layer(state_dict: Mapping[str, Tensor], config: BertConfig, hidden_states: Tensor,
                  attention_mask: Tensor | None = None, *, layer: int = 0, head_mask: Tensor | None = None,
                  options: ForwardOptions = DEFAULT_OPTIONS) -> tuple[Tensor, Tensor | None]:
    """Self-attention → output dense + residual + LayerNorm → feed-forward + residual + LayerNorm.

    ``(batch, seq, hidden)`` in and out; also returns the ``(batch, heads, seq, seq)`` attention probabilities
    (``None`` from a kernel that never forms them, such as ``"sdpa"``). ``head_mask``: ``(heads,)`` factors for
    this layer's heads (:func:`bertlib.self_attention`; chapter 13). ``options``
    (:class:`bertlib.model.options.ForwardOptions`) say how every step runs: the attention function
    (``attn_implementation``), ``fused`` LayerNorm and GELU (appendix 14, *Making it fast*), dropout
    (``training``), ``check`` and the attention function's extras. What to keep of each layer is the encoder loop's
    business (:func:`bertlib.encoder`), not the layer's. Defined in chapter 6, *The encoder layer* (HF ``BertLayer``).
    """
    context, probs = self_attention(state_dict, config, hidden_states, attention_mask, layer=layer,
                                    head_mask=head_mask, options=options)
    attn = attention_output(state_dict, config, context, hidden_states, layer=layer, options=options)
    return feed_forward(state_dict, config, attn, layer=layer, options=options), probs
