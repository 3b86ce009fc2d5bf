"""Head masks and head pruning (chapter 13, *Anatomy of Hugging Face's attention*).

Transformers 4.x let you multiply each head's attention probabilities by a ``head_mask`` factor and *prune* heads:
delete head ``h``'s rows of the query/key/value weights and the matching columns of ``attention.output.dense``
(``BertAttention.prune_heads``). Pruning head ``h`` gives exactly the output of masking it with 0, with fewer
parameters and less work. Transformers 5.x removed both; :func:`bertlib.bert_forward` keeps ``head_mask``, and this
module keeps pruning, plus the gradient-based head importance of Michel, Levy & Neubig (2019), *Are Sixteen Heads
Really Better than One?*, used to choose which heads to prune.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

import torch
import torch.nn.functional as F
from transformers import BertConfig

from .attention import extended_attention_mask
from .checks import check_config, check_inputs
from .embeddings import embeddings
from .encoder import BertForwardOutput, bert_forward
from .layer import attention_output, feed_forward
from .multi_head import transpose_for_scores
from .pooler import pooler

#: The four weights pruning touches in each layer: rows of Q/K/V (and their biases), columns of the output dense.
_QKV = ("query", "key", "value")


def head_size(config: BertConfig) -> int:
    """``hidden_size // num_attention_heads``: the width of one head (unchanged by pruning)."""
    check_config(config)
    return config.hidden_size // config.num_attention_heads


def heads_per_layer(state_dict: Mapping[str, torch.Tensor], config: BertConfig) -> list[int]:
    """How many heads each layer has in ``state_dict`` (``num_attention_heads`` before pruning, fewer after):
    the rows of the layer's query weight divided by :func:`head_size`. Defined in chapter 13."""
    d = head_size(config)
    return [state_dict[f"encoder.layer.{i}.attention.self.query.weight"].shape[0] // d
            for i in range(config.num_hidden_layers)]


def head_mask_for(config: BertConfig, heads_to_prune: Mapping[int, Iterable[int]], *,
                  dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """The ``(num_hidden_layers, num_attention_heads)`` head mask with 0 at the heads to prune and 1 elsewhere:
    the masking twin of :func:`prune_heads`. ``heads_to_prune``: ``{layer: [head, ...]}``. Defined in chapter 13."""
    _check_heads(config, heads_to_prune, [config.num_attention_heads] * config.num_hidden_layers)
    mask = torch.ones(config.num_hidden_layers, config.num_attention_heads, dtype=dtype, device=device)
    for layer, heads in heads_to_prune.items():
        for h in heads:
            mask[layer, h] = 0.0
    return mask


def _check_heads(config: BertConfig, heads_to_prune: Mapping[int, Iterable[int]], counts: list[int]) -> None:
    if not isinstance(heads_to_prune, Mapping):
        raise TypeError("heads_to_prune must be a mapping {layer: [head, ...]}, e.g. {0: [2, 5], 3: [0]}.")
    for layer, heads in heads_to_prune.items():
        if not isinstance(layer, int) or not 0 <= layer < config.num_hidden_layers:
            raise ValueError(f"layer {layer!r} does not exist: layers are 0..{config.num_hidden_layers - 1}.")
        heads = list(heads)
        bad = [h for h in heads if not isinstance(h, int) or not 0 <= h < counts[layer]]
        if bad:
            raise ValueError(f"layer {layer} has heads 0..{counts[layer] - 1}; cannot prune {bad}.")
        if len(set(heads)) != len(heads):
            raise ValueError(f"layer {layer}: head indices repeat in {heads}.")


def prune_heads(state_dict: Mapping[str, torch.Tensor], config: BertConfig,
                heads_to_prune: Mapping[int, Iterable[int]]) -> dict[str, torch.Tensor]:
    """A new state dict without the given heads: for layer ``i`` and each head ``h`` in ``heads_to_prune[i]``, the
    ``head_size`` rows of ``query``/``key``/``value`` weight and bias that compute head ``h``, and the same columns
    of ``attention.output.dense.weight`` that read its context, are removed (HF 4.x ``prune_linear_layer``).

    Head indices count the heads *present* in ``state_dict`` (after earlier pruning, the remaining heads are
    renumbered 0, 1, ... in order). A layer may lose every head: its attention then adds only the output bias.
    Other tensors are shared with ``state_dict``, not copied. Run the result with :func:`pruned_bert_forward`.
    Defined in chapter 13, *Anatomy of Hugging Face's attention*.
    """
    counts = heads_per_layer(state_dict, config)
    _check_heads(config, heads_to_prune, counts)
    d = head_size(config)
    out = dict(state_dict)
    for layer, heads in heads_to_prune.items():
        drop = set(heads)
        if not drop:
            continue
        keep = [h for h in range(counts[layer]) if h not in drop]
        index = torch.tensor([h * d + j for h in keep for j in range(d)], dtype=torch.long,
                             device=state_dict[f"encoder.layer.{layer}.attention.self.query.weight"].device)
        p = f"encoder.layer.{layer}.attention."
        for name in _QKV:  # (heads * d, hidden) → (kept * d, hidden): rows
            out[p + f"self.{name}.weight"] = state_dict[p + f"self.{name}.weight"].index_select(0, index)
            out[p + f"self.{name}.bias"] = state_dict[p + f"self.{name}.bias"].index_select(0, index)
        # (hidden, heads * d) → (hidden, kept * d): columns; the bias belongs to the output and stays
        out[p + "output.dense.weight"] = state_dict[p + "output.dense.weight"].index_select(1, index)
    return out


def pruned_self_attention(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    hidden_states: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    layer: int = 0,
    attn_implementation: str = "eager",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`bertlib.self_attention` for a layer that may have fewer heads than ``config`` says: the number of
    heads is read from the weights (:func:`heads_per_layer`), the head width from ``config``.

    ``hidden_states``: ``(batch, seq, hidden)``; ``attention_mask``: additive ``(batch, 1, 1, seq)`` or ``None``.
    Returns the context ``(batch, seq, kept * head_size)`` and the probabilities ``(batch, kept, seq, seq)``
    (``None`` under ``sdpa``). Inference only (no dropout). Defined in chapter 13.
    """
    p = f"encoder.layer.{layer}.attention.self."
    d = head_size(config)
    kept = state_dict[p + "query.weight"].shape[0] // d
    batch, seq, _ = hidden_states.shape
    if kept == 0:  # every head pruned: no context at all
        return hidden_states.new_zeros(batch, seq, 0), None
    q, k, v = (transpose_for_scores(F.linear(hidden_states, state_dict[p + n + ".weight"], state_dict[p + n + ".bias"]),
                                    kept) for n in _QKV)  # (batch, kept, seq, d)
    if attn_implementation == "sdpa":
        context, probs = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask), None
    elif attn_implementation == "eager":
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        if attention_mask is not None:
            scores = scores + attention_mask
        probs = scores.softmax(dim=-1)
        context = probs @ v
    else:
        raise ValueError(f"attn_implementation must be 'eager' or 'sdpa', got {attn_implementation!r}.")
    return context.permute(0, 2, 1, 3).reshape(batch, seq, kept * d), probs


def pruned_bert_forward(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    *,
    attn_implementation: str = "eager",
) -> BertForwardOutput:
    """:func:`bertlib.bert_forward` for a state dict from :func:`prune_heads` (it also runs an unpruned one).

    Inputs ``(batch, seq)``; outputs as :class:`bertlib.BertForwardOutput` (``attentions`` has ``kept`` heads per
    layer). Equals ``bert_forward(..., head_mask=head_mask_for(config, heads_to_prune))`` on the unpruned weights.
    Inference only. Defined in chapter 13, *Anatomy of Hugging Face's attention*.
    """
    check_config(config)
    check_inputs(config, input_ids, attention_mask, token_type_ids)
    x = embeddings(state_dict, config, input_ids, token_type_ids)
    if attention_mask is None or bool(attention_mask.all()):
        mask = None
    else:
        mask = extended_attention_mask(attention_mask, x.dtype)
    all_hidden, all_attn = [x], []
    for layer in range(config.num_hidden_layers):
        context, probs = pruned_self_attention(state_dict, config, x, mask, layer=layer,
                                               attn_implementation=attn_implementation)
        x = feed_forward(state_dict, config, attention_output(state_dict, config, context, x, layer=layer), layer=layer)
        all_hidden.append(x)
        all_attn.append(probs)
    return BertForwardOutput(last_hidden_state=x, pooler_output=pooler(state_dict, config, x),
                             hidden_states=tuple(all_hidden), attentions=tuple(all_attn))


def head_importance(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    batches: Iterable[Mapping[str, torch.Tensor]],
    loss_fn: Callable[[BertForwardOutput, Mapping[str, torch.Tensor]], torch.Tensor],
    *,
    normalize: bool = True,
    head_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Michel et al. (2019): the importance of head ``h`` of layer ``i`` is ``|dL/dxi_ih|`` summed over batches,
    where ``xi`` is a head mask of ones: how much the loss would change, to first order, if the head were scaled
    down. One forward and one backward per batch; only the mask gets a gradient. ``head_mask``
    (``(num_hidden_layers, num_attention_heads)``, default all ones) is the point where the gradient is taken: pass
    the mask of the heads already pruned to re-estimate the scores of the remaining ones.

    ``batches``: dicts with ``input_ids`` (and optionally ``attention_mask``, ``token_type_ids``), ``(batch, seq)``;
    ``loss_fn(output, batch)``: a scalar loss from :func:`bertlib.bert_forward`'s output (e.g. a classifier's
    cross-entropy). With ``normalize`` each layer's scores are divided by their L2 norm, as Michel et al. do before
    comparing heads across layers. Returns ``(num_hidden_layers, num_attention_heads)``. Defined in chapter 13.
    """
    check_config(config)
    some = next(iter(state_dict.values()))
    importance = torch.zeros(config.num_hidden_layers, config.num_attention_heads, dtype=torch.float64)
    n = 0
    shape = (config.num_hidden_layers, config.num_attention_heads)
    if head_mask is not None and tuple(head_mask.shape) != shape:
        raise ValueError(f"head_mask must have shape {shape} (layers, heads), got {tuple(head_mask.shape)}.")
    start = torch.ones(shape) if head_mask is None else head_mask.detach()
    for batch in batches:
        mask = start.to(dtype=some.dtype, device=some.device).clone().requires_grad_(True)
        out = bert_forward(state_dict, config, batch["input_ids"], batch.get("attention_mask"),
                           batch.get("token_type_ids"), head_mask=mask)
        loss = loss_fn(out, batch)
        (grad,) = torch.autograd.grad(loss, mask)
        importance += grad.detach().abs().double().cpu()
        n += 1
    if n == 0:
        raise ValueError("head_importance needs at least one batch.")
    if normalize:
        importance = importance / importance.norm(dim=1, keepdim=True).clamp_min(1e-20)
    return importance


def prune_order(importance: torch.Tensor) -> list[tuple[int, int]]:
    """Every ``(layer, head)``, least important first (ties: lower layer, then lower head first).
    ``importance``: ``(num_hidden_layers, num_attention_heads)`` from :func:`head_importance`."""
    if importance.dim() != 2:
        raise ValueError(f"importance must be (layers, heads), got shape {tuple(importance.shape)}.")
    heads = importance.shape[1]
    flat = importance.flatten().double()
    order = sorted(range(len(flat)), key=lambda i: (flat[i].item(), i))
    return [(i // heads, i % heads) for i in order]


def as_heads_to_prune(pairs: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    """``[(layer, head), ...]`` (original indices) → ``{layer: [head, ...]}`` sorted, for :func:`prune_heads`
    and :func:`head_mask_for`."""
    out: dict[int, list[int]] = {}
    for layer, head in pairs:
        out.setdefault(int(layer), []).append(int(head))
    return {k: sorted(v) for k, v in sorted(out.items())}


def attention_parameters(state_dict: Mapping[str, torch.Tensor], config: BertConfig) -> int:
    """Parameters in the self-attention blocks (Q/K/V weights and biases and the output dense weight), summed over
    layers: what pruning removes ``4 * head_size * hidden + 3 * head_size`` of per head."""
    total = 0
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}.attention."
        total += sum(state_dict[p + f"self.{n}.{w}"].numel() for n in _QKV for w in ("weight", "bias"))
        total += state_dict[p + "output.dense.weight"].numel()
    return total
