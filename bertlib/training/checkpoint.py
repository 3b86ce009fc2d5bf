"""Checkpoints that load without running code (chapter 9, *Fine-tuning on 20 Newsgroups*).

``torch.load(..., weights_only=False)`` unpickles, and unpickling can call any function the file names: a
checkpoint from elsewhere could run code on the machine that resumes from it. Here a checkpoint is one
`safetensors <https://huggingface.co/docs/safetensors>`_ file: the tensors (model, optimiser moments, random
generator states) as safetensors stores them, and everything else (the training state, the settings, the
optimiser's hyper-parameters, the schedule) as JSON in the file's header. Reading it parses a header and copies
bytes; nothing is executed. One file, written to a temporary name and renamed, so an interruption never leaves
half a checkpoint.

:func:`save` takes any nest of dicts (string or integer keys), lists, tuples, tensors, NumPy arrays and JSON
scalars (a ``state_dict()``, a random state); :func:`load` gives the same nest back. A fine-tuning run's files
(:data:`CHECKPOINT`, :data:`BEST`, :data:`METRICS` in its output directory) are written and read by the functions
at the end: :func:`save_checkpoint` / :func:`load_checkpoint` and :func:`save_weights` / :func:`load_weights`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertlib.data.files import atomic_write

#: The safetensors header key holding the JSON part.
_META_KEY = "bertlib_state"

#: A fine-tuning run's files in its output directory: the checkpoint (resume), the best epoch's weights
#: (``BertForSequenceClassification`` names) and the metrics.
CHECKPOINT = "checkpoint.safetensors"
LEGACY_CHECKPOINT = "checkpoint.pt"  # a pickle, written before 2026-11: refused, never loaded
BEST = "model.safetensors"
METRICS = "metrics.json"


def _encode(obj: Any, tensors: dict[str, torch.Tensor], key: str) -> Any:
    """``obj`` as JSON; its tensors moved into ``tensors`` under dotted keys. Containers are tagged
    (``{"dict": [[k, v], ...]}``, ``{"list": ...}``, ``{"tuple": ...}``) so integer keys and tuples survive."""
    if isinstance(obj, torch.Tensor):
        tensors[key] = obj.detach().to("cpu").contiguous().clone()
        return {"tensor": key}
    if isinstance(obj, np.ndarray):
        tensors[key] = torch.from_numpy(obj.astype(np.int64) if obj.dtype.kind in "ui" else obj.copy())
        return {"ndarray": key, "dtype": str(obj.dtype)}
    if isinstance(obj, dict):
        if not all(isinstance(k, (str, int)) for k in obj):
            raise TypeError(f"checkpoint dict keys must be str or int, got {sorted({type(k).__name__ for k in obj})}")
        return {"dict": [[k, _encode(v, tensors, f"{key}.{k}")] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        kind = "tuple" if isinstance(obj, tuple) else "list"
        return {kind: [_encode(v, tensors, f"{key}.{i}") for i, v in enumerate(obj)]}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, (np.integer, np.floating, np.bool_)):
        return obj.item()
    raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint (only tensors, arrays, containers and "
                    "JSON scalars).")


def _decode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """The inverse of :func:`_encode`."""
    if not isinstance(obj, dict):
        return obj
    if "tensor" in obj:
        return tensors[obj["tensor"]]
    if "ndarray" in obj:
        return tensors[obj["ndarray"]].numpy().astype(obj["dtype"])
    if "dict" in obj:
        return {k: _decode(v, tensors) for k, v in obj["dict"]}
    items = [_decode(v, tensors) for v in obj.get("list", obj.get("tuple", []))]
    return tuple(items) if "tuple" in obj else items


def save(tree: Any, path: str | os.PathLike) -> None:
    """Write ``tree`` to ``path`` as one safetensors file (atomically: a temporary file, then a rename)."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    meta = json.dumps(_encode(tree, tensors, "t"))
    with atomic_write(path) as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt", _META_KEY: meta})


def load(path: str | os.PathLike) -> Any:
    """What :func:`save` wrote. A file that is not such a safetensors file (a pickle, say) is refused with a
    ``ValueError`` before anything in it is interpreted."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = (f.metadata() or {}).get(_META_KEY)
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{path} is not a bertlib checkpoint (a safetensors file) and is not loaded: {err}. "
                         "Delete it to start afresh.") from err
    if meta is None:
        raise ValueError(f"{path} is a safetensors file without bertlib's training state; delete it to start afresh.")
    return _decode(json.loads(meta), tensors)


def rng_state(device: torch.device | None = None) -> dict:
    """The random states of Python, NumPy and torch (CPU; ``device``: that one CUDA device, else every visible
    one), in a form :func:`save` stores."""
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device is not None:
        state["cuda_local"] = torch.cuda.get_rng_state(device)
    elif torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Restore what :func:`rng_state` returned (CUDA states only where a matching device is present)."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if device is not None:
        if "cuda_local" in state:
            torch.cuda.set_rng_state(state["cuda_local"], device)
        elif "cuda" in state and device.index < len(state["cuda"]):
            torch.cuda.set_rng_state(state["cuda"][device.index], device)
    elif "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---- a fine-tuning run's files ------------------------------------------------------------------------------------


def save_checkpoint(path: str | os.PathLike, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler,
                    state: Any, cfg: Any, rng_ranks: list[dict]) -> None:
    """Everything a resume needs, in one safetensors file (:func:`save`): the weights, the optimiser's moments and
    hyper-parameters, the schedule, the run's state (a dataclass, :class:`bertlib.training.finetune_state.TrainState`),
    the settings (``cfg.to_dict()``), and every rank's random states. Nothing in it is a pickle."""
    save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
          "state": dataclasses.asdict(state), "config": cfg.to_dict(), "rng_ranks": rng_ranks,
          "world_size": len(rng_ranks)}, path)


def load_checkpoint(path: str | os.PathLike) -> dict:
    """What :func:`save_checkpoint` wrote, read without unpickling (a file that is not one is refused with a
    ``ValueError``). A pickled ``checkpoint.pt`` of an older bertlib beside it is refused too, never read."""
    legacy = Path(path).with_name(LEGACY_CHECKPOINT)
    if legacy.exists():
        raise ValueError(f"{legacy} is a pickled checkpoint (older bertlib). It is not loaded: unpickling a file can "
                         "run code. Delete it (or use another --out) to start afresh.")
    return load(path)


def save_weights(model: torch.nn.Module, path: str | os.PathLike, meta: dict) -> None:
    """The model's weights alone (float as they are, on the CPU) as a safetensors file, ``meta`` in its header as
    strings; atomically, so a reader finds the previous best weights or the new ones."""
    from safetensors.torch import save_file

    with atomic_write(path) as tmp:
        save_file({k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items()}, str(tmp),
                  metadata={"format": "pt", **{k: str(v) for k, v in meta.items()}})


def load_weights(model: torch.nn.Module, path: str | os.PathLike) -> None:
    """Load what :func:`save_weights` wrote into ``model`` (every name must match)."""
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path)), strict=True)
