"""Layer normalisation (chapter 3, *LayerNorm*), as in Ba et al. (2016) and HF's ``nn.LayerNorm``."""

from __future__ import annotations

import torch


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """Normalise each token's vector to mean 0, variance 1 over the last dimension, then scale and shift.

    ``x``: ``(..., hidden)``; ``weight``/``bias``: ``(hidden,)``. The variance is the biased one (divide by
    ``hidden``, not ``hidden - 1``), and ``eps`` comes from ``config.layer_norm_eps`` (1e-12 for BERT, not
    PyTorch's default 1e-5). Defined in chapter 3, *LayerNorm*.
    """
    mean = x.mean(dim=-1, keepdim=True)
    var = (x - mean).pow(2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias
