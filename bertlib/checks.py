"""Input checks shared by every step: bad input fails here, with the fix, not deep inside a matmul.

Each function raises ``TypeError`` (wrong kind of thing) or ``ValueError`` (right kind, wrong value)
with a message that names the problem and says how to fix it.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import BertConfig


def expected_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of ``transformers.BertModel`` for ``config``, by its HF name, with its shape.

    ``5 + 16 * num_hidden_layers + 2`` entries (103 for the 6-layer MiniLM). Buffers such as
    ``embeddings.position_ids`` are not parameters and are not listed.
    """
    H, I = config.hidden_size, config.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "embeddings.word_embeddings.weight": (config.vocab_size, H),
        "embeddings.position_embeddings.weight": (config.max_position_embeddings, H),
        "embeddings.token_type_embeddings.weight": (config.type_vocab_size, H),
        "embeddings.LayerNorm.weight": (H,),
        "embeddings.LayerNorm.bias": (H,),
    }
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for name in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            shapes[p + name + ".weight"] = (H, H)
            shapes[p + name + ".bias"] = (H,)
        shapes[p + "intermediate.dense.weight"] = (I, H)
        shapes[p + "intermediate.dense.bias"] = (I,)
        shapes[p + "output.dense.weight"] = (H, I)
        shapes[p + "output.dense.bias"] = (H,)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + ln + ".weight"] = (H,)
            shapes[p + ln + ".bias"] = (H,)
    shapes["pooler.dense.weight"] = (H, H)
    shapes["pooler.dense.bias"] = (H,)
    return shapes


def check_config(config: BertConfig) -> None:
    """Reject configurations the absolute-position BERT forward pass cannot run."""
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
    pos_type = getattr(config, "position_embedding_type", "absolute")
    if pos_type != "absolute":
        raise ValueError(
            f"position_embedding_type={pos_type!r} is not supported by bert_forward, which implements "
            "absolute (learned) position embeddings as in the original BERT. Use a config with "
            "position_embedding_type='absolute'."
        )


def check_state_dict(state_dict: Mapping[str, torch.Tensor], config: BertConfig) -> None:
    """Every parameter ``bert_forward`` needs is present, a tensor, and of the shape ``config`` implies."""
    shapes = expected_shapes(config)
    given = {k: tuple(v.shape) for k, v in state_dict.items() if k in shapes}  # reads no tensor twice
    missing = [k for k in shapes if k not in given]
    if missing:
        shown = ", ".join(missing)
        hint = ""
        if any(k.startswith("bert.") for k in state_dict):
            hint = " The keys start with 'bert.': load it with bertlib.load_pretrained(), which strips the prefix."
        raise ValueError(
            f"state_dict is missing {len(missing)} parameter(s) of BertModel: {shown}.{hint} "
            "Pass the state dict of a BertModel (e.g. bertlib.load_pretrained().state_dict) whose config "
            "matches the one given."
        )
    wrong = [f"{k}: {given[k]} (config implies {shape})" for k, shape in shapes.items() if given[k] != shape]
    if wrong:
        raise ValueError(
            "state_dict shapes do not match the config: " + "; ".join(wrong[:6])
            + ". Use the config that was saved with these weights."
        )


def check_inputs(
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
) -> None:
    """Token ids, mask and segment ids are tensors of matching ``(batch, seq)`` shape and valid values."""
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
    if token_type_ids is not None:
        if token_type_ids.is_floating_point():
            raise TypeError(f"token_type_ids must be integers, got dtype {token_type_ids.dtype}; call .long().")
        lo, hi = int(token_type_ids.min()), int(token_type_ids.max())
        if lo < 0 or hi >= config.type_vocab_size:
            raise ValueError(
                f"token_type_ids must lie in [0, {config.type_vocab_size}) (type_vocab_size), got min {lo}, "
                f"max {hi}. Segment A is 0, segment B is 1."
            )


def check_hidden(config: BertConfig, hidden_states: torch.Tensor, name: str = "hidden_states") -> None:
    """A ``(batch, seq, hidden_size)`` floating tensor, as every encoder step expects."""
    if not isinstance(hidden_states, torch.Tensor) or not hidden_states.is_floating_point():
        raise TypeError(f"{name} must be a floating-point torch.Tensor of shape (batch, seq, hidden).")
    if hidden_states.dim() != 3 or hidden_states.shape[-1] != config.hidden_size:
        raise ValueError(
            f"{name} must have shape (batch, seq, {config.hidden_size}), got {tuple(hidden_states.shape)}. "
            "For one sentence add the batch dimension with .unsqueeze(0)."
        )
