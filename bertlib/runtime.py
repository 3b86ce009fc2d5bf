"""Device, profile, seeds and tolerances: the first cell of every chapter calls :func:`setup`."""

from __future__ import annotations

import os
import platform
import random
import sys
from dataclasses import dataclass

import numpy as np
import torch

PROFILES = ("quick", "full")

#: Tolerances the book asserts with, by (device type, dtype): ``dict(atol=..., rtol=...)``.
#: float32, on CPU and on CUDA with TF32 off: our reductions are ordered differently from HF's kernels, so a few
#: ulps per op accumulate over the layers (measured 2.9e-6 on CPU and 2.6e-6 on an H100 after 6 layers, real
#: tokens); 2e-5 leaves room for 12 layers. float64: only rounding at the 1e-15 scale remains (measured 6e-15).
#: bfloat16 and float16 keep 8 and 11 bits of mantissa (relative error ~4e-3 and ~5e-4 per op): checks in those
#: dtypes are demonstrations with a stated, much looser budget.
TOLERANCES: dict[tuple[str, torch.dtype], dict[str, float]] = {
    ("cpu", torch.float32): dict(atol=2e-5, rtol=0.0),
    ("cuda", torch.float32): dict(atol=2e-5, rtol=0.0),
    ("cpu", torch.float64): dict(atol=1e-10, rtol=0.0),
    ("cuda", torch.float64): dict(atol=1e-10, rtol=0.0),
    ("cpu", torch.bfloat16): dict(atol=1e-1, rtol=5e-2),
    ("cuda", torch.bfloat16): dict(atol=1e-1, rtol=5e-2),
    ("cuda", torch.float16): dict(atol=2e-2, rtol=1e-2),
}


def tolerance(device: str | torch.device, dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """``atol``/``rtol`` for comparing our tensors with HF's on ``device`` in ``dtype`` (see :data:`TOLERANCES`)."""
    key = (torch.device(device).type, dtype)
    if key not in TOLERANCES:
        raise ValueError(f"no tolerance is stated for {key}; add one to bertlib.runtime.TOLERANCES with its reason.")
    return TOLERANCES[key]


def progress_enabled() -> bool:
    """Whether to draw tqdm bars: only on an interactive terminal and never under CI (``$CI``), to keep logs short."""
    return sys.stderr.isatty() and not os.environ.get("CI")


def get_device() -> torch.device:
    """``$BERTLIB_DEVICE`` if set, else CUDA when available, else CPU."""
    name = os.environ.get("BERTLIB_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def get_profile(device: torch.device | None = None) -> str:
    """``$BERTLIB_PROFILE`` (``quick`` or ``full``); by default ``full`` on CUDA and ``quick`` on CPU."""
    device = device or get_device()
    profile = os.environ.get("BERTLIB_PROFILE") or ("full" if device.type == "cuda" else "quick")
    if profile not in PROFILES:
        raise ValueError(f"BERTLIB_PROFILE must be one of {PROFILES}, got {profile!r}.")
    return profile


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and PyTorch (every device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Setup:
    """What :func:`setup` chose: the ``device``, the ``profile`` and the ``seed``."""

    device: torch.device
    profile: str
    seed: int


def setup(seed: int = 0, verbose: bool = True) -> Setup:
    """Choose the device and profile once, seed everything, and turn TF32 off so float32 checks are exact.

    Prints one line a reader (and a CI log) can read, e.g. ``profile=quick device=cpu torch=2.13.0 ...``.
    """
    import transformers

    device = get_device()
    profile = get_profile(device)
    set_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = False  # fidelity: TF32 matmuls round to 10-bit mantissas
    torch.backends.cudnn.allow_tf32 = False
    if verbose:
        extra = f" gpu={torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
        print(f"profile={profile} device={device}{extra} torch={torch.__version__} "
              f"transformers={transformers.__version__} python={platform.python_version()} seed={seed}")
    return Setup(device=device, profile=profile, seed=seed)
