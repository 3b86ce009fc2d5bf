"""Input checks shared by every step: bad input fails here, with the fix, not deep inside a matmul.

Each function raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong value)
with a message that names the problem and says how to fix it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import BertConfig

#: ``config.position_embedding_type`` values that add a per-layer distance table (HF 4.x, chapter 13).
RELATIVE_TYPES = ("relative_key", "relative_key_query")

#: The pooler's parameters: optional, as in HF (``BertModel(config, add_pooling_layer=False)``).
POOLER_KEYS = ("pooler.dense.weight", "pooler.dense.bias")


def position_embedding_type(config: BertConfig) -> str:
    """``config.position_embedding_type``, ``"absolute"`` when unset (transformers 5 no longer sets it)."""
    return getattr(config, "position_embedding_type", None) or "absolute"


def pruned_heads(config: BertConfig) -> dict[int, frozenset[int]]:
    """``config.pruned_heads`` as ``{layer: heads}`` with int keys in ``0..num_hidden_layers - 1`` (a config read
    from JSON has string keys; HF 4.x also stores negative layer indices as given). Original head numbering."""
    raw = getattr(config, "pruned_heads", None) or {}
    L = config.num_hidden_layers
    out: dict[int, frozenset[int]] = {}
    for layer, heads in raw.items():
        i = int(layer)
        if not -L <= i < L:
            raise ValueError(f"config.pruned_heads names layer {layer!r}, but the model has {L} layers.")
        out[i % L] = out.get(i % L, frozenset()) | frozenset(int(h) for h in heads)
    return out


def kept_heads(config: BertConfig, layer: int) -> list[int]:
    """The original numbers of the heads layer ``layer`` still has after ``config.pruned_heads`` (chapter 13)."""
    gone = pruned_heads(config).get(layer, frozenset())
    return [h for h in range(config.num_attention_heads) if h not in gone]


def expected_shapes(config: BertConfig, *, pooler: bool = True) -> dict[str, tuple[int, ...]]:
    """Every parameter of ``transformers.BertModel`` for ``config``, by its HF name, with its shape.

    ``5 + 16 * num_hidden_layers + 2`` entries (103 for the 6-layer MiniLM); ``pooler=False`` leaves out the
    pooler's two (HF's ``add_pooling_layer=False``). A layer with pruned heads (``config.pruned_heads``) has
    ``kept * head_size`` rows of Q/K/V and columns of the attention output; a relative position type adds one
    ``distance_embedding`` table per layer (HF 4.x). Buffers such as ``embeddings.position_ids`` are not listed.
    """
    H, I = config.hidden_size, config.intermediate_size
    d = H // max(config.num_attention_heads, 1)
    relative = position_embedding_type(config) in RELATIVE_TYPES
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (config.vocab_size, H),
        "embeddings.position_embeddings.weight": (config.max_position_embeddings, H),
        "embeddings.token_type_embeddings.weight": (config.type_vocab_size, H),
        "embeddings.LayerNorm.weight": (H,),
        "embeddings.LayerNorm.bias": (H,),
    }
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}."
        A = len(kept_heads(config, i)) * d  # all_head_size of this layer
        for name in ("attention.self.query", "attention.self.key", "attention.self.value"):
            shapes[p + name + ".weight"] = (A, H)
            shapes[p + name + ".bias"] = (A,)
        if relative:
            shapes[p + "attention.self.distance_embedding.weight"] = (2 * config.max_position_embeddings - 1, d)
        shapes[p + "attention.output.dense.weight"] = (H, A)
        shapes[p + "attention.output.dense.bias"] = (H,)
        shapes[p + "intermediate.dense.weight"] = (I, H)
        shapes[p + "intermediate.dense.bias"] = (I,)
        shapes[p + "output.dense.weight"] = (H, I)
        shapes[p + "output.dense.bias"] = (H,)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + ln + ".weight"] = (H,)
            shapes[p + ln + ".bias"] = (H,)
    if pooler:
        shapes["pooler.dense.weight"] = (H, H)
        shapes["pooler.dense.bias"] = (H,)
    return shapes


def check_config(config: BertConfig) -> None:
    """Reject configurations bertlib's forward pass cannot run, naming the field and the fix."""
    if not isinstance(config, BertConfig):
        raise TypeError(
            f"config must be a transformers.BertConfig, got {type(config).__name__}. "
            "Use bertlib.load_pretrained().config or transformers.BertConfig(...)."
        )
    if config.num_attention_heads <= 0 or config.hidden_size % config.num_attention_heads != 0:
        raise ValueError(
            f"hidden_size={config.hidden_size} is not divisible by num_attention_heads="
            f"{config.num_attention_heads}: each head gets hidden_size / num_attention_heads dimensions. "
            "Choose a head count that divides the hidden size (e.g. 12 heads for 384 or 768)."
        )
    pos_type = position_embedding_type(config)
    if pos_type not in ("absolute", *RELATIVE_TYPES):
        raise ValueError(f"position_embedding_type={pos_type!r} is not supported: use 'absolute' (BERT's learned "
                         f"positions) or one of {RELATIVE_TYPES} (HF 4.x, chapter 13).")
    if getattr(config, "add_cross_attention", False):
        raise ValueError("config.add_cross_attention=True (an encoder-decoder's cross-attention) is not implemented "
                         "by bertlib, which runs BERT's self-attention stack only. Use a config with "
                         "add_cross_attention=False, or transformers.BertModel for a seq2seq decoder.")


def _missing_summary(missing: list[str], config: BertConfig) -> str:
    """The missing keys, short: a whole missing layer as one item, then at most six keys by name."""
    items, rest = [], list(missing)
    for i in range(config.num_hidden_layers):
        mine = [k for k in rest if k.startswith(f"encoder.layer.{i}.")]
        if len(mine) >= 16:
            items.append(f"all of encoder.layer.{i}.* ({len(mine)} keys)")
            rest = [k for k in rest if k not in mine]
    items += rest[:6]
    more = f" and {len(rest) - 6} more" if len(rest) > 6 else ""
    return ", ".join(items) + more


def check_state_dict(state_dict: Mapping[str, torch.Tensor], config: BertConfig, *,
                     pooler: bool | None = None) -> None:
    """Every parameter ``bert_forward`` needs is present, a tensor, and of the shape ``config`` implies.

    ``pooler``: ``True`` requires the pooler's weights, ``False`` ignores them, ``None`` checks them when present.
    Keys of other modules (``cls.*``, ``classifier.*``) are ignored. A state dict whose keys carry the ``bert.``
    prefix of a ``BertFor...`` model gets one short error pointing at :func:`bertlib.split_bert_state_dict`.
    """
    if pooler is None:
        pooler = any(k in state_dict for k in POOLER_KEYS)
    shapes = expected_shapes(config, pooler=pooler)
    given = {k: tuple(v.shape) for k, v in state_dict.items() if k in shapes}  # reads no tensor twice
    missing = [k for k in shapes if k not in given]
    if missing and any(k.startswith("bert.") for k in state_dict):
        still = [k for k in missing if "bert." + k not in state_dict]
        raise ValueError(
            "state_dict keys start with 'bert.' (the state dict of a BertFor... model, e.g. BertForMaskedLM): "
            "strip the prefix and set the task head aside with encoder_sd, head_sd = "
            "bertlib.split_bert_state_dict(state_dict)."
            + (f" Even then it lacks {_missing_summary(still, config)}." if still else "")
        )
    if missing:
        tables = any("distance_embedding" in k for k in missing)
        raise ValueError(
            f"state_dict is missing {len(missing)} parameter(s) of BertModel: {_missing_summary(missing, config)}. "
            + ("Relative positions need one distance table per layer: add them with "
               "bertlib.variants.relative_position.add_distance_embeddings(state_dict, config). " if tables else "")
            + "Pass the state dict of a BertModel (e.g. bertlib.load_pretrained().state_dict) whose config "
            "matches the one given."
        )
    wrong = [k for k, shape in shapes.items() if given[k] != shape]
    if wrong:
        raise ValueError("state_dict shapes do not match the config: " + _wrong_summary(wrong, given, shapes, config))


def _wrong_summary(wrong: list[str], given: dict, shapes: dict, config: BertConfig) -> str:
    """Wrong shapes, short: a layer whose attention has another head count is one item (pruning), then at most
    four keys with both shapes, then the fix."""
    d = config.hidden_size // config.num_attention_heads
    items, pruning = [], False
    for i in range(config.num_hidden_layers):
        q = f"encoder.layer.{i}.attention.self.query.weight"
        if q in wrong:
            pruning = True
            items.append(f"layer {i}'s attention weights hold {given[q][0] // d} heads ({q}: {given[q]}), the config "
                         f"implies {shapes[q][0] // d}")
            wrong = [k for k in wrong if not (k.startswith(f"encoder.layer.{i}.attention.")
                                              and (".self." in k or "output.dense.weight" in k))]
    items += [f"{k}: {given[k]} (config implies {shapes[k]})" for k in wrong[:4]]
    hint = (" Weights with fewer heads come from pruning: use the config that bertlib.variants.head_pruning.prune() "
            "returned (its pruned_heads records which heads are gone), or the config.json saved with them."
            if pruning else "")
    return "; ".join(items) + ". Use the config that was saved with these weights." + hint


def check_devices(state_dict: Mapping[str, torch.Tensor], **tensors: torch.Tensor | None) -> None:
    """The inputs (``input_ids=...``, ``attention_mask=...``) lie on the device of the weights (the word embedding
    table's), so a mismatch is named here rather than deep inside the first lookup or matmul."""
    weights = state_dict.get("embeddings.word_embeddings.weight")
    if not isinstance(weights, torch.Tensor):
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.device != weights.device:
            raise ValueError(f"{name} is on {t.device} but the weights are on {weights.device}. Move one to the "
                             f"other: {name}.to('{weights.device}') (or the tokenizer's output: "
                             f"enc.to('{weights.device}')), or load the weights with device='{t.device}'.")


def check_inputs(
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
) -> None:
    """Token ids, mask, segment ids and position ids are tensors of matching ``(batch, seq)`` shape (position ids
    may also be ``(1, seq)`` or ``(seq,)``, shared by the batch, as in HF) and valid values. Reads each tensor's
    min and max: a GPU→CPU copy, so :func:`bertlib.bert_forward` runs it once per call (none with ``check=False``)."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(
            f"input_ids must be a torch.Tensor of token ids, got {type(input_ids).__name__}. "
            "Use tokenizer(texts, return_tensors='pt')['input_ids']."
        )
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(
            f"input_ids must hold integer token ids (torch.long), got dtype {input_ids.dtype}. "
            "Token ids index the embedding table; use the tokenizer's ids or call .long() on integer data."
        )
    if input_ids.dim() != 2:
        fix = " For one sentence use input_ids.unsqueeze(0)." if input_ids.dim() == 1 else ""
        raise ValueError(f"input_ids must have shape (batch, seq), got {tuple(input_ids.shape)}.{fix}")
    seq = input_ids.shape[1]
    if seq == 0:
        raise ValueError("input_ids has an empty sequence dimension; every sequence needs at least one token.")
    if seq > config.max_position_embeddings:
        raise ValueError(
            f"sequence length {seq} is longer than the position table (max_position_embeddings="
            f"{config.max_position_embeddings}). Truncate: tokenizer(..., truncation=True, "
            f"max_length={config.max_position_embeddings})."
        )
    lo, hi = int(input_ids.min()), int(input_ids.max())
    if lo < 0 or hi >= config.vocab_size:
        raise ValueError(
            f"input_ids contain ids outside the vocabulary [0, {config.vocab_size}): min {lo}, max {hi}. "
            "Use the tokenizer that belongs to this model's weights."
        )
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}.")
        if tuple(t.shape) != tuple(input_ids.shape):
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but input_ids has shape {tuple(input_ids.shape)}; "
                "they must match. Take both from the same tokenizer(...) call."
            )
    if attention_mask is not None and not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token).")
    _check_ids(config, input_ids, token_type_ids, position_ids)


def _check_ids(config: BertConfig, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
               position_ids: torch.Tensor | None) -> None:
    if position_ids is not None:
        if not isinstance(position_ids, torch.Tensor) or position_ids.is_floating_point():
            raise TypeError("position_ids must be a torch.Tensor of integer positions (torch.long).")
        seq = input_ids.shape[1]
        if tuple(position_ids.shape) not in {(seq,), (1, seq), tuple(input_ids.shape)}:
            raise ValueError(f"position_ids has shape {tuple(position_ids.shape)}; use (batch, seq) = "
                             f"{tuple(input_ids.shape)}, (1, {seq}) or ({seq},).")
        lo, hi = int(position_ids.min()), int(position_ids.max())
        if lo < 0 or hi >= config.max_position_embeddings:
            raise ValueError(f"position_ids must lie in [0, {config.max_position_embeddings}) "
                             f"(max_position_embeddings), got min {lo}, max {hi}.")
    if token_type_ids is not None:
        if token_type_ids.is_floating_point():
            raise TypeError(f"token_type_ids must be integers, got dtype {token_type_ids.dtype}; call .long().")
        lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
        if lo < 0 or hi >= config.type_vocab_size:
            raise ValueError(
                f"token_type_ids must lie in [0, {config.type_vocab_size}) (type_vocab_size), got min {lo}, "
                f"max {hi}. Segment A is 0, segment B is 1."
            )


def check_head_mask(config: BertConfig, head_mask: torch.Tensor, *, layers: bool | None = None) -> None:
    """``head_mask`` holds per-head factors (HF 4.x, chapter 13): a floating-point tensor of shape ``(heads,)``
    (one layer, or the same for every layer) or ``(num_hidden_layers, heads)``. ``layers=True`` requires the
    second shape, ``False`` the first, ``None`` accepts both. Heads are counted in the original numbering, pruned
    ones included."""
    if not isinstance(head_mask, torch.Tensor) or not head_mask.is_floating_point():
        raise TypeError("head_mask must be a floating-point torch.Tensor of per-head factors (1.0 keeps a head, "
                        "0.0 switches it off).")
    L, H = config.num_hidden_layers, config.num_attention_heads
    shape = tuple(head_mask.shape)
    if layers is None and shape not in ((H,), (L, H)):
        raise ValueError(f"head_mask must have shape ({H},) or ({L}, {H}) (layers, heads), got {shape}.")
    if layers is False and shape != (H,):
        raise ValueError(f"head_mask for one layer must have shape ({H},) (one factor per head), got {shape}.")
    if layers is True and shape != (L, H):
        raise ValueError(f"head_mask must have shape ({L}, {H}) (layers, heads), got {shape}.")


def check_hidden(config: BertConfig, hidden_states: torch.Tensor, name: str = "hidden_states") -> None:
    """A ``(batch, seq, hidden_size)`` floating tensor, as every encoder step expects."""
    if not isinstance(hidden_states, torch.Tensor) or not hidden_states.is_floating_point():
        raise TypeError(f"{name} must be a floating-point torch.Tensor of shape (batch, seq, hidden).")
    if hidden_states.dim() != 3 or hidden_states.shape[-1] != config.hidden_size:
        raise ValueError(
            f"{name} must have shape (batch, seq, {config.hidden_size}), got {tuple(hidden_states.shape)}. "
            "For one sentence add the batch dimension with .unsqueeze(0)."
        )
