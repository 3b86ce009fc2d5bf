"""BERT's whole forward pass in NumPy, float64 (chapter 12, *BERT in NumPy*).

The same steps as the torch functions of chapters 2-8, with the same names and the same state dict (converted once
by :func:`numpy_state_dict`), written with nothing but ``numpy`` and ``math``: no torch, no autograd, no kernels.
It shows that BERT's forward pass is a few dozen array operations, and serves as an independent float64 reference:
it equals :func:`bertlib.bert_forward` in float64 to about 1e-13 (asserted at 1e-10) and
``transformers.BertModel`` in float32 to its float32 rounding (asserted at 2e-5).

Only inference: there is no dropout and no gradient.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

# ---- conversion ---------------------------------------------------------------------------------------------------


def to_numpy(x: Any, dtype: Any = None) -> np.ndarray:
    """A NumPy array from a NumPy array, a list, or a (CPU or GPU) torch tensor, without importing torch."""
    if hasattr(x, "detach"):  # a torch.Tensor: leave autograd and the device behind
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def numpy_state_dict(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Every floating-point tensor of a BERT state dict as a float64 NumPy array (other entries, such as the
    integer ``embeddings.position_ids`` buffer, are kept as integer arrays). Convert once, then run
    :func:`bert_forward` as often as you like. Defined in chapter 12, *BERT in NumPy*.
    """
    out = {}
    for name, tensor in state_dict.items():
        a = to_numpy(tensor)
        out[name] = a.astype(np.float64) if np.issubdtype(a.dtype, np.floating) else a
    return out


# ---- elementary functions -----------------------------------------------------------------------------------------

_ERF = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """The error function, element-wise: ``math.erf`` (the C library's ``erf``, accurate to about 1 ulp in
    float64) applied to every element. NumPy has no ``erf`` of its own; this loop in C over Python floats costs
    about 0.1-0.5 us per element, fast enough for a forward pass. Any shape in, the same shape out.
    """
    return np.asarray(_ERF(np.asarray(x, dtype=np.float64)), dtype=np.float64)


def erf_approx(x: np.ndarray) -> np.ndarray:
    """Abramowitz & Stegun formula 7.1.26, a 5-term polynomial in ``t = 1/(1 + p|x|)`` times ``exp(-x^2)``:
    vectorised NumPy, maximum absolute error 1.5e-7 (their bound). Good enough for float32, far from float64;
    shown in chapter 12 for contrast, not used by the forward pass.
    """
    x = np.asarray(x, dtype=np.float64)
    p, a = 0.3275911, (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)
    t = 1.0 / (1.0 + p * np.abs(x))
    poly = t * (a[0] + t * (a[1] + t * (a[2] + t * (a[3] + t * a[4]))))
    return np.sign(x) * (1.0 - poly * np.exp(-x * x))


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, ``0.5 x (1 + erf(x / sqrt 2))`` (BERT's ``"gelu"``). Same shape in and out.
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.gelu`, chapter 6).
    """
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """The tanh approximation of GELU (``"gelu_new"``), ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``.
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.gelu_tanh`, chapter 6).
    """
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


#: ``config.hidden_act`` → NumPy function (the same names as :data:`bertlib.model.layer.ACTIVATIONS`).
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "gelu": gelu,
    "gelu_new": gelu_tanh,
    "gelu_pytorch_tanh": gelu_tanh,
    "relu": lambda x: np.maximum(x, 0.0),
    "silu": lambda x: x * 0.5 * (1.0 + np.tanh(0.5 * x)),  # x * sigmoid(x), in a form that cannot overflow
    "swish": lambda x: x * 0.5 * (1.0 + np.tanh(0.5 * x)),
    "tanh": np.tanh,
}


def activation(name: str) -> Callable[[np.ndarray], np.ndarray]:
    """The NumPy function named by ``config.hidden_act``. Defined in chapter 12, *BERT in NumPy*."""
    if name not in ACTIVATIONS:
        raise ValueError(f"hidden_act={name!r} is not supported; use one of {sorted(ACTIVATIONS)}.")
    return ACTIVATIONS[name]


def softmax_naive(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """``exp(x) / sum(exp(x))`` as written on paper. Overflows to ``inf`` (then ``inf / inf = nan``) once an entry
    exceeds ``log(finfo.max)`` (709.8 in float64, 88.7 in float32). Chapter 10, section 10.4 shows the failure
    and chapter 12 the fix (:func:`softmax`); never use it.
    """
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax: subtract each row's maximum first. ``softmax(x - c) = softmax(x)`` for any
    constant ``c``, and with ``c = max`` every exponent is ``<= 0``, so nothing overflows and the largest term is
    exactly 1 (the sum is at least 1: no division by zero). Same shape in and out.
    Defined in chapter 12, *BERT in NumPy*.
    """
    with np.errstate(over="ignore"):  # x - max <= 0: an overflow can only give -inf, and exp(-inf) = 0 is right
        e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``x W^T + b`` with PyTorch's ``(out, in)`` weight layout: ``(..., in)`` → ``(..., out)``."""
    return x @ weight.T + bias


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    """Normalise the last axis to mean 0 and (biased) variance 1, then scale and shift. ``x``: ``(..., hidden)``;
    ``weight``, ``bias``: ``(hidden,)``. Defined in chapter 12, *BERT in NumPy* (torch: chapter 3).
    """
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


# ---- the model ----------------------------------------------------------------------------------------------------


def _check(config: Any, input_ids: np.ndarray, attention_mask: np.ndarray | None,
           token_type_ids: np.ndarray | None) -> None:
    if input_ids.ndim != 2 or not np.issubdtype(input_ids.dtype, np.integer):
        raise ValueError(f"input_ids must be a (batch, seq) integer array, got shape {input_ids.shape} "
                         f"and dtype {input_ids.dtype}.")
    if input_ids.shape[1] > config.max_position_embeddings:
        raise ValueError(f"sequence length {input_ids.shape[1]} exceeds max_position_embeddings="
                         f"{config.max_position_embeddings}; truncate the input.")
    if input_ids.min() < 0 or input_ids.max() >= config.vocab_size:
        raise ValueError(f"input_ids must lie in [0, {config.vocab_size}).")
    for name, a in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if a is not None and a.shape != input_ids.shape:
            raise ValueError(f"{name} has shape {a.shape}, input_ids {input_ids.shape}: they must match.")


def embeddings(state_dict: Mapping[str, np.ndarray], config: Any, input_ids: np.ndarray,
               token_type_ids: np.ndarray | None = None) -> np.ndarray:
    """``LayerNorm(word[input_ids] + token_type[token_type_ids] + position[0..T-1])`` by fancy indexing.

    ``input_ids``, ``token_type_ids``: ``(batch, seq)`` integers → ``(batch, seq, hidden)``.
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.embeddings`, chapter 2).
    """
    p = "embeddings."
    input_ids = to_numpy(input_ids)
    token_type_ids = np.zeros_like(input_ids) if token_type_ids is None else to_numpy(token_type_ids)
    seq = input_ids.shape[1]
    word = state_dict[p + "word_embeddings.weight"][input_ids]  # (batch, seq, hidden)
    token_type = state_dict[p + "token_type_embeddings.weight"][token_type_ids]  # (batch, seq, hidden)
    position = state_dict[p + "position_embeddings.weight"][np.arange(seq)]  # (seq, hidden), broadcast
    x = word + token_type + position
    return layer_norm(x, state_dict[p + "LayerNorm.weight"], state_dict[p + "LayerNorm.bias"], config.layer_norm_eps)


def extended_attention_mask(attention_mask: np.ndarray) -> np.ndarray:
    """``(batch, seq)`` 1/0 → additive ``(batch, 1, 1, seq)``: 0 for tokens, ``finfo(float64).min`` for padding.
    Defined in chapter 12, *BERT in NumPy* (torch: chapter 4).
    """
    m = to_numpy(attention_mask).astype(np.float64)[:, None, None, :]
    return (1.0 - m) * np.finfo(np.float64).min


def transpose_for_scores(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(batch, seq, hidden)`` → ``(batch, heads, seq, head_size)`` with ``reshape`` then ``swapaxes(1, 2)``.
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.transpose_for_scores`, chapter 5).
    """
    batch, seq, hidden = x.shape
    return x.reshape(batch, seq, num_heads, hidden // num_heads).swapaxes(1, 2)


def self_attention(state_dict: Mapping[str, np.ndarray], config: Any, hidden_states: np.ndarray,
                   attention_mask: np.ndarray | None = None, *, layer: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head self-attention of encoder layer ``layer``: ``softmax(Q K^T / sqrt(d) + mask) V`` for all heads.

    ``hidden_states``: ``(batch, seq, hidden)``; ``attention_mask``: additive ``(batch, 1, 1, seq)`` or ``None``.
    Returns the context ``(batch, seq, hidden)`` and the probabilities ``(batch, heads, seq, seq)``.
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.self_attention`, chapter 5).
    """
    p = f"encoder.layer.{layer}.attention.self."
    heads = config.num_attention_heads
    q, k, v = (transpose_for_scores(linear(hidden_states, state_dict[p + n + ".weight"], state_dict[p + n + ".bias"]),
                                    heads) for n in ("query", "key", "value"))  # (batch, heads, seq, head_size)
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (batch, heads, seq, seq)
    if attention_mask is not None:
        scores = scores + attention_mask
    probs = softmax(scores, axis=-1)
    context = probs @ v  # (batch, heads, seq, head_size)
    batch, _, seq, _ = context.shape
    return context.swapaxes(1, 2).reshape(batch, seq, config.hidden_size), probs


def attention_output(state_dict: Mapping[str, np.ndarray], config: Any, context: np.ndarray,
                     input_tensor: np.ndarray, *, layer: int = 0) -> np.ndarray:
    """``LayerNorm(input_tensor + context W_O^T + b_O)``; ``(batch, seq, hidden)`` in and out.
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.attention_output`, chapter 6).
    """
    p = f"encoder.layer.{layer}.attention.output."
    h = linear(context, state_dict[p + "dense.weight"], state_dict[p + "dense.bias"])
    return layer_norm(h + input_tensor, state_dict[p + "LayerNorm.weight"], state_dict[p + "LayerNorm.bias"],
                      config.layer_norm_eps)


def feed_forward(state_dict: Mapping[str, np.ndarray], config: Any, attention_out: np.ndarray, *, layer: int = 0,
                 act: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """``LayerNorm(x + act(x W_1^T + b_1) W_2^T + b_2)``; ``(batch, seq, hidden)`` in and out, ``(batch, seq,
    intermediate)`` in the middle. ``act`` defaults to ``config.hidden_act`` (pass :func:`gelu_tanh` to swap it).
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.feed_forward`, chapter 6).
    """
    p = f"encoder.layer.{layer}."
    act = act or activation(config.hidden_act)
    h = act(linear(attention_out, state_dict[p + "intermediate.dense.weight"],
                   state_dict[p + "intermediate.dense.bias"]))
    h = linear(h, state_dict[p + "output.dense.weight"], state_dict[p + "output.dense.bias"])
    return layer_norm(h + attention_out, state_dict[p + "output.LayerNorm.weight"],
                      state_dict[p + "output.LayerNorm.bias"], config.layer_norm_eps)


def encoder_layer(state_dict: Mapping[str, np.ndarray], config: Any, hidden_states: np.ndarray,
                  attention_mask: np.ndarray | None = None, *, layer: int = 0,
                  act: Callable[[np.ndarray], np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Self-attention → output dense + residual + LayerNorm → feed-forward + residual + LayerNorm.
    ``(batch, seq, hidden)`` in and out, plus the ``(batch, heads, seq, seq)`` probabilities.
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.encoder_layer`, chapter 6).
    """
    context, probs = self_attention(state_dict, config, hidden_states, attention_mask, layer=layer)
    attn = attention_output(state_dict, config, context, hidden_states, layer=layer)
    return feed_forward(state_dict, config, attn, layer=layer, act=act), probs


def encoder(state_dict: Mapping[str, np.ndarray], config: Any, hidden_states: np.ndarray,
            attention_mask: np.ndarray | None = None, *,
            act: Callable[[np.ndarray], np.ndarray] | None = None,
            ) -> tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]:
    """The loop over ``config.num_hidden_layers`` layers. Returns every hidden state (embeddings first,
    ``num_hidden_layers + 1`` arrays ``(batch, seq, hidden)``) and every layer's probabilities.
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.encoder`, chapter 7).
    """
    all_hidden, all_attn = [hidden_states], []
    for layer in range(config.num_hidden_layers):
        hidden_states, probs = encoder_layer(state_dict, config, hidden_states, attention_mask, layer=layer, act=act)
        all_hidden.append(hidden_states)
        all_attn.append(probs)
    return tuple(all_hidden), tuple(all_attn)


def pooler(state_dict: Mapping[str, np.ndarray], config: Any, sequence_output: np.ndarray) -> np.ndarray:
    """``tanh(W h_[CLS] + b)``: ``(batch, seq, hidden)`` → ``(batch, hidden)``.
    Defined in chapter 12, *BERT in NumPy* (torch: :func:`bertlib.pooler`, chapter 8).
    """
    return np.tanh(linear(sequence_output[:, 0], state_dict["pooler.dense.weight"], state_dict["pooler.dense.bias"]))


@dataclass
class NumpyBertOutput:
    """What :func:`bert_forward` returns: the fields of :class:`bertlib.BertForwardOutput`, as float64 arrays."""

    last_hidden_state: np.ndarray
    pooler_output: np.ndarray
    hidden_states: tuple[np.ndarray, ...]
    attentions: tuple[np.ndarray, ...]


def bert_forward(state_dict: Mapping[str, np.ndarray], config: Any, input_ids: Any, attention_mask: Any = None,
                 token_type_ids: Any = None, *,
                 act: Callable[[np.ndarray], np.ndarray] | None = None) -> NumpyBertOutput:
    """BERT's forward pass in NumPy: embeddings → encoder loop → pooler.

    ``state_dict``: from :func:`numpy_state_dict`; ``input_ids``, ``attention_mask``, ``token_type_ids``:
    ``(batch, seq)`` integer arrays (torch tensors are converted). ``act`` replaces ``config.hidden_act`` (e.g.
    :func:`gelu_tanh`, to measure what the approximation changes). Equals :func:`bertlib.bert_forward` in float64.
    Defined in chapter 12, *BERT in NumPy*.
    """
    input_ids = to_numpy(input_ids)
    attention_mask = None if attention_mask is None else to_numpy(attention_mask)
    token_type_ids = None if token_type_ids is None else to_numpy(token_type_ids)
    _check(config, input_ids, attention_mask, token_type_ids)
    x = embeddings(state_dict, config, input_ids, token_type_ids)
    mask = None if attention_mask is None else extended_attention_mask(attention_mask)
    hidden, attn = encoder(state_dict, config, x, mask, act=act)
    return NumpyBertOutput(last_hidden_state=hidden[-1], pooler_output=pooler(state_dict, config, hidden[-1]),
                           hidden_states=hidden, attentions=attn)
