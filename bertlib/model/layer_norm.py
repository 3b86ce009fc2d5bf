"""Layer normalisation (chapter 3, *LayerNorm*), as in Ba et al. (2016) and HF's ``nn.LayerNorm``."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, *, fused: bool = False
               ) -> torch.Tensor:
    """Normalise each token's vector to mean 0, variance 1 over the last dimension, then scale and shift.

    ``x``: ``(..., hidden)``; ``weight``/``bias``: ``(hidden,)``. The variance is the biased one (divide by
    ``hidden``, not ``hidden - 1``), and ``eps`` comes from ``config.layer_norm_eps`` (1e-12 for BERT, not
    PyTorch's default 1e-5). Defined in chapter 3, *LayerNorm*.

    ``fused=True`` computes the same formula with PyTorch's one-kernel ``F.layer_norm`` (one pass over memory
    instead of seven elementwise ops); the fast path of appendix 14, *Making it fast*.
    """
    if fused:
        return F.layer_norm(x, x.shape[-1:], weight, bias, eps)
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias
