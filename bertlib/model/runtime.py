"""Device, profile, seeds and tolerances (chapter 1): :func:`configure` chooses them once; every chapter's first
cell calls :func:`bertlib.course.setup`, which is :func:`configure` plus bertviz's offline views."""

from __future__ import annotations

import contextlib
import os
import platform
import random
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch

#: The profiles, by name: how much a chapter or a command does. The chapters run ``quick`` (CPU in minutes) or, for
#: any other profile, their full-size experiments; what each profile sets for fine-tuning is
#: :data:`bertlib.training.finetune_config.PROFILES` (the one table of profile values, keyed by exactly these names).
Profile = Literal["quick", "cpu", "full"]
PROFILE_NAMES: tuple[str, ...] = get_args(Profile)

#: The label of a position no loss is computed on (PyTorch's ``ignore_index`` default, HF's convention): the
#: unmasked tokens of MLM (chapter 11), the continuation sub-tokens of tagging (chapter 15b). Every layer reads it.
IGNORE_INDEX = -100

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
        raise ValueError(f"no tolerance is stated for {key}; add one to bertlib.model.runtime.TOLERANCES with its "
                         "reason.")
    return TOLERANCES[key]


def bf16_supported(device: str | torch.device = "cpu") -> bool:
    """Whether ``device`` multiplies bfloat16 matrices natively, so that bfloat16 autocast makes a step faster.

    CPU: oneDNN (``torch.backends.mkldnn``) with the ``avx512_bf16`` instructions (AMD Zen 4 on, Intel Cooper Lake)
    or AMX tiles (Intel Sapphire Rapids on), as ``torch.cpu`` reports them from the CPU's flags. Elsewhere oneDNN
    would emulate bfloat16 in float32 and run slower than float32 itself, so the answer is False. CUDA: Ampere on
    (``torch.cuda.is_bf16_supported``, without emulation). Any other device: False. Chapter 14.9 measures what it buys.
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    cpu = torch.cpu
    flags = (getattr(cpu, "_is_avx512_bf16_supported", None), getattr(cpu, "_is_amx_tile_supported", None))
    return any(flag is not None and flag() for flag in flags)


def autocast_for(device: str | torch.device, enabled: bool = True) -> contextlib.AbstractContextManager:
    """bfloat16 autocast on ``device`` when ``enabled`` and :func:`bf16_supported`, else a no-op (float32).

    Under it, matrix products and the other ops on autocast's lower-precision list run in bfloat16 while the weights
    (the master copy), their gradients and the optimizer's state stay float32, as in mixed-precision training on GPU;
    the loss comes out float32. Wrap the forward pass and the loss only, never ``backward`` or ``optimizer.step``.
    Chapter 14.9 times it and measures the loss and gradients against float32.
    """
    device = torch.device(device)
    if enabled and bf16_supported(device):
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def progress_enabled() -> bool:
    """Whether to draw tqdm bars: only on an interactive terminal and never under CI (``$CI``), to keep logs short."""
    return sys.stderr.isatty() and not os.environ.get("CI")


def get_device() -> torch.device:
    """``$BERTLIB_DEVICE`` if set (checked by :func:`check_device`), else CUDA when available, else CPU."""
    name = os.environ.get("BERTLIB_DEVICE")
    if name:
        return check_device(name, "BERTLIB_DEVICE")
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def check_device(name: str | torch.device, option: str = "device") -> torch.device:
    """``torch.device(name)``, refused with the fix when it is not a device name or names a GPU this machine or
    this torch build does not have (``option``: the setting to name in the message, e.g. ``--device``)."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"{option}={name!r} is not a device: use cpu, cuda or cuda:N.") from err
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ValueError(f"{option}={name!r}, but torch finds no CUDA GPU (torch {torch.__version__}, "
                             f"CUDA build: {torch.version.cuda or 'no'}). Use {option}=cpu, or on a GPU machine "
                             "install a CUDA build of torch (make install TORCH=\"torch --index-url "
                             "https://download.pytorch.org/whl/cu126\").")
        if device.index is not None and device.index >= count:
            raise ValueError(f"{option}={name!r}, but this machine has {count} CUDA GPU(s): use cuda:0 to "
                             f"cuda:{count - 1}.")
    return device


def get_profile(device: torch.device | None = None) -> str:
    """``$BERTLIB_PROFILE`` (one of :data:`PROFILE_NAMES`); by default ``full`` on CUDA and ``quick`` on CPU.
    The chapters run their small experiments under ``quick`` and their full-size ones under any other profile."""
    device = device or get_device()
    profile = os.environ.get("BERTLIB_PROFILE") or ("full" if device.type == "cuda" else "quick")
    if profile not in PROFILE_NAMES:
        raise ValueError(f"BERTLIB_PROFILE must be one of {PROFILE_NAMES}, got {profile!r}: unset it or set e.g. "
                         "BERTLIB_PROFILE=quick.")
    return profile


def default_seed() -> int:
    """``$BERTLIB_SEED`` (an integer), else 0: the seed of :func:`configure` and of every ``seed=None`` default.

    ``make sweep`` runs the chapters that train, sample or time something under several values of it.
    """
    value = os.environ.get("BERTLIB_SEED", "").strip()
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"BERTLIB_SEED must be an integer, got {value!r}: "
                         "unset it or set e.g. BERTLIB_SEED=1.") from None


def resolve_seed(seed: int | None) -> int:
    """``seed`` itself when given, else :func:`default_seed` (so ``BERTLIB_SEED`` reaches every library default)."""
    return default_seed() if seed is None else int(seed)


def num_threads() -> int | None:
    """``$BERTLIB_NUM_THREADS`` if set (e.g. 1: another reduction order, a stand-in for another CPU), else None."""
    value = os.environ.get("BERTLIB_NUM_THREADS", "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"BERTLIB_NUM_THREADS must be a positive integer, got {value!r}.")
    return int(value)


def set_seed(seed: int) -> None:
    """Seed Python, NumPy and PyTorch (every device)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


# ---- seeded initialisation: every random weight bertlib creates comes from one of these ----


def seeded_generator(seed: int | None = None) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (default ``$BERTLIB_SEED``, else 0). Drawing from it leaves the global
    generators alone, so creating a weight does not change what the caller's code draws next."""
    return torch.Generator().manual_seed(resolve_seed(seed))


def normal_init(shape: Sequence[int], std: float, generator: torch.Generator,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """A weight as Hugging Face initialises one (``_init_weights``): ``N(0, std^2)``, ``std`` being
    ``config.initializer_range``, drawn in ``dtype`` (default: torch's default dtype) from ``generator``; biases
    start at zero, LayerNorm at one."""
    return torch.randn(tuple(shape), generator=generator, dtype=dtype) * std


@contextlib.contextmanager
def seeded(seed: int | None = None) -> Iterator[None]:
    """Run the block with torch's global generators seeded (``seed``, default ``$BERTLIB_SEED``) and put them back
    afterwards: a module's own default initialisation (``nn.Linear``), reproducible, without touching the caller's
    random state."""
    with torch.random.fork_rng():
        torch.manual_seed(resolve_seed(seed))
        yield


def hardware(device: torch.device, world_size: int = 1) -> str:
    """What a run ran on, for its ``metrics.json``: the GPU's name, or the CPU's model with torch's threads and the
    machine's cores; under DDP, how many processes of it."""
    if world_size > 1:
        return f"{world_size} processes × {hardware(device)}"
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {torch.get_num_threads()} threads of {os.cpu_count()} cores"


@dataclass
class Setup:
    """What :func:`configure` chose: the ``device``, the ``profile``, the ``seed`` and torch's CPU ``threads``."""

    device: torch.device
    profile: str
    seed: int
    threads: int


def configure(seed: int | None = None, verbose: bool = True) -> Setup:
    """Choose the device and profile once, seed everything, and turn TF32 off so float32 checks are exact.

    ``seed`` defaults to ``$BERTLIB_SEED`` (else 0) and ``$BERTLIB_NUM_THREADS`` sets torch's CPU threads. Prints one
    line a reader (and a CI log) can read, e.g. ``profile=quick device=cpu torch=2.13.0 ... seed=0 threads=2``.
    The commands (``bertlib-bench``, ``bertlib-fidelity``) start with it; a chapter with
    :func:`bertlib.course.setup`, which adds bertviz's offline views.
    """
    import transformers

    device = get_device()
    profile = get_profile(device)
    seed, threads = resolve_seed(seed), num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    set_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = False  # fidelity: TF32 matmuls round to 10-bit mantissas
    torch.backends.cudnn.allow_tf32 = False
    if verbose:
        extra = f" gpu={torch.cuda.get_device_name(device)}" if device.type == "cuda" else ""
        print(f"profile={profile} device={device}{extra} torch={torch.__version__} "
              f"transformers={transformers.__version__} python={platform.python_version()} seed={seed} "
              f"threads={torch.get_num_threads()}")
    return Setup(device=device, profile=profile, seed=seed, threads=torch.get_num_threads())
