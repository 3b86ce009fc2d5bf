"""The padding-free forward pass (appendix 14, *Making it fast*).

A padded batch ``(batch, seq)`` spends most of its work on padding when posts differ in length: every dense layer,
LayerNorm and GELU runs on every position, real or not. But only attention mixes tokens; everything else acts on each
token alone. So gather the real tokens into one ``(tokens, hidden)`` matrix, run every per-token step on it, and run
attention sequence by sequence on its own slice (``cu_seqlens``, as FlashAttention's variable-length kernels call the
offsets). No position is padding, so no mask is needed, and the result equals :func:`bertlib.bert_forward` on
every real token.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from transformers import BertConfig

from .checks import check_config, check_inputs, check_state_dict
from .encoder import BertForwardOutput
from .layer import attention_output, feed_forward
from .layer_norm import layer_norm
from .multi_head import transpose_for_scores
from .pooler import pooler


def unpad(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Where the real tokens are. ``attention_mask``: ``(batch, seq)`` of 0/1.

    Returns the flat indices of the real tokens into ``batch * seq`` (``(tokens,)``), the offsets ``cu_seqlens``
    (``(batch + 1,)``: sequence ``b`` is rows ``cu_seqlens[b]:cu_seqlens[b+1]`` of the unpadded matrix) and the
    lengths as Python ints.
    """
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    indices = mask.flatten().nonzero().squeeze(1)
    cu_seqlens = F.pad(lengths.cumsum(0), (1, 0))
    return indices, cu_seqlens, lengths.tolist()


def varlen_self_attention(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    hidden_states: torch.Tensor,
    lengths: list[int],
    *,
    layer: int = 0,
) -> torch.Tensor:
    """Self-attention over unpadded tokens: ``(tokens, hidden)`` in, the concatenated heads ``(tokens, hidden)`` out.

    The Q/K/V projections run once on all tokens; each sequence then attends within its own slice with the fused
    ``scaled_dot_product_attention`` (no mask: a slice holds no padding).
    """
    p = f"encoder.layer.{layer}.attention.self."
    heads = config.num_attention_heads
    q, k, v = (F.linear(hidden_states, state_dict[p + n + ".weight"], state_dict[p + n + ".bias"])
               for n in ("query", "key", "value"))  # (tokens, hidden) each
    out = torch.empty_like(q)
    start = 0
    for length in lengths:
        s = slice(start, start + length)
        qs, ks, vs = (transpose_for_scores(t[s].unsqueeze(0), heads) for t in (q, k, v))  # (1, heads, L, head_size)
        out[s] = F.scaled_dot_product_attention(qs, ks, vs).transpose(1, 2).reshape(length, -1)
        start += length
    return out


def bert_forward_unpadded(
    state_dict: Mapping[str, torch.Tensor],
    config: BertConfig,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
    *,
    output_hidden_states: bool = False,
) -> BertForwardOutput:
    """:func:`bertlib.bert_forward` without computing a single padding position (inference only).

    ``input_ids``, ``attention_mask``, ``token_type_ids``: ``(batch, seq)``; each row's real tokens must be its
    first ones (right padding, what tokenizers produce). Returns ``last_hidden_state`` ``(batch, seq, hidden)``
    with zeros at padding, ``pooler_output`` ``(batch, hidden)``, and, with ``output_hidden_states``, every hidden
    state (embeddings, then one per layer) in the same padded layout; ``attentions`` are ``None`` (the fused kernel
    never forms them).
    """
    check_config(config)
    check_state_dict(state_dict, config)
    check_inputs(config, input_ids, attention_mask, token_type_ids)
    batch, seq = input_ids.shape
    lengths_t = attention_mask.sum(dim=1)
    expected = torch.arange(seq, device=attention_mask.device) < lengths_t[:, None]
    if not torch.equal(attention_mask.bool(), expected):
        raise ValueError("bert_forward_unpadded needs right padding (each row's real tokens first, then padding); "
                         "tokenize with padding_side='right' or use bertlib.bert_forward.")
    indices, _, lengths = unpad(attention_mask)
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)

    def flat(t: torch.Tensor) -> torch.Tensor:  # (batch, seq) -> (tokens,)
        return t.flatten()[indices]

    def pad(x: torch.Tensor) -> torch.Tensor:  # (tokens, hidden) -> (batch, seq, hidden), zeros at padding
        out = x.new_zeros(batch * seq, x.shape[-1])
        out[indices] = x
        return out.view(batch, seq, -1)

    e = "embeddings."
    x = (state_dict[e + "word_embeddings.weight"][flat(input_ids)]
         + state_dict[e + "token_type_embeddings.weight"][flat(token_type_ids)]
         + state_dict[e + "position_embeddings.weight"][flat(positions)])
    x = layer_norm(x, state_dict[e + "LayerNorm.weight"], state_dict[e + "LayerNorm.bias"], config.layer_norm_eps,
                   fused=True)  # (tokens, hidden)
    hidden = [x]  # (tokens, hidden) each
    for layer in range(config.num_hidden_layers):
        context = varlen_self_attention(state_dict, config, x, lengths, layer=layer)
        x = attention_output(state_dict, config, context, x, layer=layer, fused=True)
        x = feed_forward(state_dict, config, x, layer=layer, fused=True)
        hidden.append(x)
    padded = tuple(pad(h) for h in hidden) if output_hidden_states else (pad(x),)
    return BertForwardOutput(
        last_hidden_state=padded[-1],
        pooler_output=pooler(state_dict, config, padded[-1]),
        hidden_states=padded if output_hidden_states else (),
        attentions=(None,) * config.num_hidden_layers,
    )
