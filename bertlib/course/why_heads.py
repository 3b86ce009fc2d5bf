"""Why several heads? Chapter 5's experiments (*All heads, batched*): a task that needs two things at once, learnt
by one attention layer with one head of size ``H`` or ``A`` heads of size ``H/A`` (the same parameters), and the
real model's heads silenced one at a time.

The attention layer is :func:`bertlib.self_attention` itself, run on trainable weights: only
``config.num_attention_heads`` differs between the two models.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig

from bertlib.model.encoder import OUTPUTS_ONLY, bert_forward
from bertlib.model.multi_head import self_attention
from bertlib.model.options import ForwardOptions
from bertlib.model.runtime import normal_init, seeded_generator


def neighbours_task(n: int, seq: int, vocab: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` sequences of ``seq`` random tokens ``(n, seq)`` from ``0 .. vocab - 1``, and the targets
    ``(n, seq, 2)``: at position ``i`` the token at ``i - 1`` (the previous one) and the token at ``i + 1`` (the
    next one); ``-100`` (ignored by ``F.cross_entropy``) where there is none. Two things at once, for every token.
    Defined in chapter 5."""
    tokens = torch.randint(vocab, (n, seq), generator=torch.Generator().manual_seed(seed))
    targets = torch.full((n, seq, 2), -100, dtype=torch.long)
    targets[:, 1:, 0] = tokens[:, :-1]
    targets[:, :-1, 1] = tokens[:, 1:]
    return tokens, targets


class OneAttentionLayer(nn.Module):
    """Token and position embeddings ``(vocab, hidden)``, ``(seq, hidden)`` → one multi-head self-attention
    (:func:`bertlib.self_attention` with ``heads`` heads of ``hidden // heads``) and its output dense, added to the
    input → a linear readout of two predictions per token, ``(batch, seq, 2, vocab)``. No LayerNorm, no
    feed-forward: the heads are the only place where tokens meet. The parameter count does not depend on
    ``heads``. Weights ``N(0, 1/fan_in)`` from ``seed``. Defined in chapter 5."""

    def __init__(self, vocab: int, seq: int, hidden: int, heads: int, *, seed: int | None = None):
        super().__init__()
        gen = seeded_generator(seed)
        self.config = BertConfig(hidden_size=hidden, num_attention_heads=heads, num_hidden_layers=1,
                                 intermediate_size=4 * hidden, vocab_size=vocab, max_position_embeddings=seq)
        self.vocab = vocab
        self.token = nn.Parameter(normal_init((vocab, hidden), 1.0, gen))
        self.position = nn.Parameter(normal_init((seq, hidden), 1.0, gen))
        p = "encoder.layer.0.attention."
        names = [p + "self.query", p + "self.key", p + "self.value", p + "output.dense"]
        self.weights = nn.ParameterDict({
            **{(n + ".weight").replace(".", "/"): nn.Parameter(normal_init((hidden, hidden), hidden**-0.5, gen))
               for n in names},
            **{(n + ".bias").replace(".", "/"): nn.Parameter(torch.zeros(hidden)) for n in names}})
        self.readout = nn.Parameter(normal_init((2 * vocab, hidden), hidden**-0.5, gen))

    def state_dict_view(self) -> dict[str, torch.Tensor]:
        """The attention weights under the names :func:`bertlib.self_attention` reads (``encoder.layer.0...``)."""
        return {k.replace("/", "."): v for k, v in self.weights.items()}

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` ``(batch, seq)`` → logits ``(batch, seq, 2, vocab)``: the previous and the next token."""
        sd = self.state_dict_view()
        h = self.token[tokens] + self.position[: tokens.shape[1]]
        context, _ = self_attention(sd, self.config, h, None, options=ForwardOptions(check=False))
        h = h + F.linear(context, sd["encoder.layer.0.attention.output.dense.weight"],
                         sd["encoder.layer.0.attention.output.dense.bias"])
        return (h @ self.readout.T).unflatten(-1, (2, self.vocab))


def pair_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` ``(batch, seq, 2, vocab)`` against ``targets`` ``(batch, seq, 2)``
    (``-100`` ignored). Defined in chapter 5."""
    return F.cross_entropy(logits.flatten(0, 2), targets.flatten())


def pair_accuracy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    """The fraction of the previous tokens and of the next tokens predicted right (positions with a target).
    ``logits`` ``(batch, seq, 2, vocab)``, ``targets`` ``(batch, seq, 2)``. Defined in chapter 5."""
    right = logits.argmax(-1) == targets
    has = targets != -100
    return tuple((right[..., k] & has[..., k]).sum().item() / has[..., k].sum().item() for k in range(2))


def ablate_heads(state_dict: Mapping[str, torch.Tensor], config: BertConfig, batch: Mapping[str, torch.Tensor],
                 change: Callable[[torch.Tensor, torch.Tensor], float]) -> torch.Tensor:
    """Silence each head on its own (``head_mask`` 0 for that head, 1 elsewhere, :func:`bertlib.bert_forward`) and
    measure ``change(full, ablated)`` between the last hidden states ``(batch, seq, hidden)`` with and without it.
    ``batch``: ``input_ids``, ``attention_mask`` (``token_type_ids``) ``(batch, seq)``. Returns
    ``(num_hidden_layers, num_attention_heads)``. Defined in chapter 5 (``head_mask``: chapter 13)."""
    run = lambda mask: bert_forward(state_dict, config, batch["input_ids"], batch["attention_mask"],  # noqa: E731
                                    batch.get("token_type_ids"), head_mask=mask, add_pooling_layer=False,
                                    **OUTPUTS_ONLY).last_hidden_state
    full = run(None)
    L, A = config.num_hidden_layers, config.num_attention_heads
    effect = torch.zeros(L, A)
    for layer in range(L):
        for head in range(A):
            mask = torch.ones(L, A, dtype=full.dtype, device=full.device)
            mask[layer, head] = 0.0
            effect[layer, head] = change(full, run(mask))
    return effect
