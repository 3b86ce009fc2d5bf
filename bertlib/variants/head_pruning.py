"""Head masks and head pruning (chapter 13, *Anatomy of Hugging Face's attention*).

Transformers 4.x let you multiply each head's attention probabilities by a ``head_mask`` factor and *prune* heads:
delete head ``h``'s rows of the query/key/value weights and the matching columns of ``attention.output.dense``
(``BertAttention.prune_heads``). Pruning head ``h`` gives exactly the output of masking it with 0, with fewer
parameters and less work. Transformers 5.x removed both; :func:`bertlib.bert_forward` keeps ``head_mask``, and this
module keeps pruning, plus the gradient-based head importance of Michel, Levy & Neubig (2019), *Are Sixteen Heads
Really Better than One?*, used to choose which heads to prune.

Pruning follows 4.x exactly (:func:`prune`): original head numbers, already-pruned heads ignored, negative layer
indices, and ``config.pruned_heads`` recording the result. A pruned model runs through the one layer loop,
:func:`bertlib.bert_forward`, which reads ``config.pruned_heads`` as HF 4.x did when loading a pruned checkpoint.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping

import torch
from transformers import BertConfig

from bertlib.model.checks import check_config, check_head_mask, check_state_dict, kept_heads, pruned_heads
from bertlib.model.encoder import FAST, BertForwardOutput, bert_forward

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


def _normalise(config: BertConfig, heads_to_prune: Mapping[int, Iterable[int]]) -> dict[int, set[int]]:
    """``{layer: heads}`` checked, with negative layer indices counted from the end (HF 4.x indexes
    ``encoder.layer[layer]``, so ``-1`` is the last layer) and repeated heads merged (HF takes a set)."""
    if not isinstance(heads_to_prune, Mapping):
        raise TypeError("heads_to_prune must be a mapping {layer: [head, ...]}, e.g. {0: [2, 5], -1: [0]}.")
    L, H = config.num_hidden_layers, config.num_attention_heads
    out: dict[int, set[int]] = {}
    for layer, heads in heads_to_prune.items():
        if not isinstance(layer, int) or not -L <= layer < L:
            raise ValueError(f"layer {layer!r} does not exist: layers are 0..{L - 1} (or -{L}..-1 from the end).")
        heads = list(heads)
        bad = [h for h in heads if not isinstance(h, int) or not 0 <= h < H]
        if bad:
            raise ValueError(f"layer {layer} has heads 0..{H - 1} (original numbering, pruned ones included); "
                             f"cannot prune {bad}.")
        out.setdefault(layer % L, set()).update(heads)
    return out


def head_mask_for(config: BertConfig, heads_to_prune: Mapping[int, Iterable[int]], *,
                  dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """The ``(num_hidden_layers, num_attention_heads)`` head mask with 0 at the heads to prune and 1 elsewhere:
    the masking twin of :func:`prune`. ``heads_to_prune``: ``{layer: [head, ...]}``. Defined in chapter 13."""
    mask = torch.ones(config.num_hidden_layers, config.num_attention_heads, dtype=dtype, device=device)
    for layer, heads in _normalise(config, heads_to_prune).items():
        for h in heads:
            mask[layer, h] = 0.0
    return mask


def prune(state_dict: Mapping[str, torch.Tensor], config: BertConfig,
          heads_to_prune: Mapping[int, Iterable[int]]) -> tuple[dict[str, torch.Tensor], BertConfig]:
    """HF 4.x's ``PreTrainedModel.prune_heads`` on raw weights: a new state dict without the given heads and a copy
    of ``config`` whose ``pruned_heads`` records them (what HF saves in ``config.json``, and what
    :func:`bertlib.bert_forward` reads to run the smaller layers).

    For layer ``i`` and each head ``h`` in ``heads_to_prune[i]``, the ``head_size`` rows of ``query``/``key``/
    ``value`` weight and bias that compute head ``h``, and the same columns of ``attention.output.dense.weight``
    that read its context, are removed (HF 4.x ``find_pruneable_heads_and_indices`` + ``prune_linear_layer``).
    As in HF, heads keep their *original* numbers however often you prune, heads already pruned are ignored,
    a repeated head counts once, and layer ``-1`` is the last layer. A layer may lose every head: its attention then
    adds only the output bias. Other tensors are shared with ``state_dict``, not copied.
    Defined in chapter 13, *Anatomy of Hugging Face's attention*.
    """
    check_config(config)
    todo = _normalise(config, heads_to_prune)
    check_state_dict(state_dict, config, pooler=False)  # the weights match the heads config.pruned_heads left
    d = head_size(config)
    out, already = dict(state_dict), pruned_heads(config)
    for layer, heads in todo.items():
        gone = already.get(layer, frozenset())
        kept = kept_heads(config, layer)  # original numbers, in the order their rows are stored
        drop = heads - gone
        if not drop:
            continue
        rows = [j for j, h in enumerate(kept) if h not in drop]  # positions among the stored heads
        p = f"encoder.layer.{layer}.attention."
        index = torch.tensor([r * d + c for r in rows for c in range(d)], dtype=torch.long,
                             device=state_dict[p + "self.query.weight"].device)
        for name in _QKV:  # (kept * d, hidden) → (fewer * d, hidden): rows
            out[p + f"self.{name}.weight"] = state_dict[p + f"self.{name}.weight"].index_select(0, index)
            out[p + f"self.{name}.bias"] = state_dict[p + f"self.{name}.bias"].index_select(0, index)
        # (hidden, kept * d) → (hidden, fewer * d): columns; the bias belongs to the output and stays
        out[p + "output.dense.weight"] = state_dict[p + "output.dense.weight"].index_select(1, index)
        already[layer] = gone | drop
    new_config = copy.deepcopy(config)
    new_config.pruned_heads = {layer: sorted(heads) for layer, heads in sorted(already.items())}
    return out, new_config


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
    down. One forward and one backward per batch; only the mask gets a gradient. The forward runs SDPA attention with
    the mask on each head's context (``(p xi) V = xi (p V)``) and one-kernel LayerNorm/GELU (chapter 14): the same
    gradient as chapter 5's batched heads, about 20 % faster on a CPU. ``head_mask``
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
    if head_mask is not None:
        check_head_mask(config, head_mask, layers=True)
    shape = (config.num_hidden_layers, config.num_attention_heads)
    start = torch.ones(shape) if head_mask is None else head_mask.detach()
    for batch in batches:
        mask = start.to(dtype=some.dtype, device=some.device).clone().requires_grad_(True)
        out = bert_forward(state_dict, config, batch["input_ids"], batch.get("attention_mask"),
                           batch.get("token_type_ids"), head_mask=mask, **FAST)
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
    """``[(layer, head), ...]`` (original indices) → ``{layer: [head, ...]}`` sorted, for :func:`prune` and
    :func:`head_mask_for`."""
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
