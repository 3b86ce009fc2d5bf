"""Why normalise? Chapter 3's experiments (*LayerNorm*): the scale of the residual stream with and without
LayerNorm, in the real model and in a random deep stack, and a small stack trained both ways.

Every function reuses the book's building blocks (:func:`bertlib.layer_norm`, :func:`bertlib.self_attention`,
:func:`bertlib.activation`, :func:`bertlib.bert_forward`); "without LayerNorm" means each LayerNorm is replaced by
the identity, nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import nn
from transformers import BertConfig

from bertlib.model.encoder import bert_forward
from bertlib.model.layer import activation
from bertlib.model.layer_norm import layer_norm
from bertlib.model.multi_head import self_attention
from bertlib.model.options import ForwardOptions
from bertlib.model.runtime import normal_init, progress_enabled, seeded_generator


def rms(h: torch.Tensor, real: torch.Tensor | None = None) -> float:
    """Root mean square of ``h`` ``(..., hidden)``, over the positions where ``real`` ``(...)`` is true (all when
    ``None``): the typical size of one number of the residual stream. Defined in chapter 3."""
    return h[real].pow(2).mean().sqrt().item() if real is not None else h.pow(2).mean().sqrt().item()


def encoder_layer_without_norm(state_dict: Mapping[str, torch.Tensor], config: BertConfig, h: torch.Tensor,
                               attention_mask: torch.Tensor | None = None, *, layer: int = 0) -> torch.Tensor:
    """:func:`bertlib.encoder_layer` with both LayerNorms replaced by the identity: ``h + attn(h)``, then
    ``+ FFN``. ``h``: ``(batch, seq, hidden)`` in and out; ``attention_mask`` additive ``(batch, 1, 1, seq)``.
    Defined in chapter 3 (the layer itself: chapter 6)."""
    p = f"encoder.layer.{layer}."
    context, _ = self_attention(state_dict, config, h, attention_mask, layer=layer, options=ForwardOptions(check=False))
    h = h + F.linear(context, state_dict[p + "attention.output.dense.weight"],
                     state_dict[p + "attention.output.dense.bias"])
    u = F.linear(h, state_dict[p + "intermediate.dense.weight"], state_dict[p + "intermediate.dense.bias"])
    act = activation(config.hidden_act)
    return h + F.linear(act(u), state_dict[p + "output.dense.weight"], state_dict[p + "output.dense.bias"])


def residual_rms(state_dict: Mapping[str, torch.Tensor], config: BertConfig, input_ids: torch.Tensor,
                 attention_mask: torch.Tensor, token_type_ids: torch.Tensor | None = None, *,
                 normalise: bool = True) -> list[float]:
    """RMS of the residual stream on real tokens after the embeddings and after each layer: ``L + 1`` numbers.

    ``normalise=True``: the model as it is (:func:`bertlib.bert_forward`'s hidden states); ``False``: every
    LayerNorm, the embeddings' included, replaced by the identity. ``input_ids`` etc.: ``(batch, seq)``.
    Defined in chapter 3.
    """
    real = attention_mask.bool()
    if normalise:
        out = bert_forward(state_dict, config, input_ids, attention_mask, token_type_ids, add_pooling_layer=False)
        return [rms(h, real) for h in out.hidden_states]
    if token_type_ids is None:
        token_type_ids = torch.zeros_like(input_ids)
    h = (state_dict["embeddings.word_embeddings.weight"][input_ids]
         + state_dict["embeddings.token_type_embeddings.weight"][token_type_ids]
         + state_dict["embeddings.position_embeddings.weight"][: input_ids.shape[1]])
    mask = (1.0 - attention_mask[:, None, None, :].to(h.dtype)) * torch.finfo(h.dtype).min
    sizes = [rms(h, real)]
    for layer in range(config.num_hidden_layers):
        h = encoder_layer_without_norm(state_dict, config, h, mask, layer=layer)
        sizes.append(rms(h, real))
    return sizes


class ToyStack(nn.Module):
    """A deep stack of residual feed-forward blocks, ``h <- Norm(h + W_2 GELU(W_1 h + b_1) + b_2)``, with ``Norm``
    :func:`bertlib.layer_norm` (BERT's post-LN arrangement) or the identity (``norm=False``).

    Input ``(batch, n_in)`` → a linear map to ``width`` → ``depth`` blocks (inner width ``4 * width``) → a linear
    readout to ``n_out``. Weights are ``N(0, 1/fan_in)`` from ``seed`` (the scale that keeps one linear map's output
    as large as its input), biases 0, LayerNorm gains 1. Defined in chapter 3.
    """

    def __init__(self, n_in: int, width: int, depth: int, n_out: int, *, norm: bool = True, seed: int | None = None):
        super().__init__()
        gen = seeded_generator(seed)
        weight = lambda rows, cols: nn.Parameter(normal_init((rows, cols), cols**-0.5, gen))  # noqa: E731
        self.norm, self.eps = norm, 1e-12
        self.w_in, self.w_out = weight(width, n_in), weight(n_out, width)
        self.w1 = nn.ParameterList([weight(4 * width, width) for _ in range(depth)])
        self.w2 = nn.ParameterList([weight(width, 4 * width) for _ in range(depth)])
        self.b1 = nn.ParameterList([nn.Parameter(torch.zeros(4 * width)) for _ in range(depth)])
        self.b2 = nn.ParameterList([nn.Parameter(torch.zeros(width)) for _ in range(depth)])
        self.gamma = nn.ParameterList([nn.Parameter(torch.ones(width)) for _ in range(depth)])
        self.beta = nn.ParameterList([nn.Parameter(torch.zeros(width)) for _ in range(depth)])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
        """``x`` ``(batch, n_in)`` → the readout ``(batch, n_out)`` and the stream's RMS after the input map and
        after each block (``depth + 1`` numbers)."""
        h = x @ self.w_in.T
        sizes = [rms(h)]
        for w1, b1, w2, b2, g, b in zip(self.w1, self.b1, self.w2, self.b2, self.gamma, self.beta, strict=True):
            h = h + F.linear(F.gelu(F.linear(h, w1, b1)), w2, b2)
            if self.norm:
                h = layer_norm(h, g, b, self.eps)
            sizes.append(rms(h))
        return h @ self.w_out.T, sizes


def teacher_task(n: int, n_in: int, classes: int, *, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A small classification task: ``n`` Gaussian inputs ``(n, n_in)`` labelled ``(n,)`` by a fixed random
    teacher, ``argmax(tanh(x T_1) T_2)`` over ``classes``, with the teacher drawn from ``seed``.
    Defined in chapter 3."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, n_in, generator=gen)
    t1, t2 = torch.randn(n_in, 4 * n_in, generator=gen), torch.randn(4 * n_in, classes, generator=gen)
    return x, (torch.tanh(x @ t1 / n_in**0.5) @ t2).argmax(-1)


def train(model: nn.Module, batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
          loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], *, steps: int, lr: float,
          desc: str = "training") -> list[float]:
    """``steps`` of plain SGD at learning rate ``lr``: ``batch(step)`` gives inputs and targets, ``loss_fn(output,
    targets)`` a scalar (``model`` may return a tuple: its first element is the output). Returns the loss of every
    step; a loss that is not finite stops the run (the rest is ``inf``). Defined in chapter 3 (reused in 5)."""
    from tqdm.auto import trange

    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses: list[float] = []
    with torch.enable_grad():
        for step in trange(steps, desc=desc, disable=not progress_enabled()):
            x, y = batch(step)
            out = model(x)
            loss = loss_fn(out[0] if isinstance(out, tuple) else out, y)
            if not torch.isfinite(loss):
                return losses + [float("inf")] * (steps - step)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses
