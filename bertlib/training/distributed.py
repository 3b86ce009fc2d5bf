"""More than one process: ``torchrun`` / ``accelerate launch`` set-up for fine-tuning (chapter 9, *more than one
GPU*).

``python -m bertlib.training.finetune`` runs unchanged under a launcher, which sets ``WORLD_SIZE``, ``RANK`` and
``LOCAL_RANK``::

    torchrun --nproc_per_node=4 -m bertlib.training.finetune --profile full --out runs/full-ddp

Each process joins a process group (NCCL on CUDA, on ``cuda:LOCAL_RANK``; gloo on CPU, :func:`init_distributed`) and
trains the model wrapped in :class:`~torch.nn.parallel.DistributedDataParallel`. The *global* batches are the
single-process ones (:func:`bertlib.data.batches.epoch_batches`); :func:`shard_batch` gives each rank a contiguous,
disjoint share of each, and each rank's loss is its share's summed cross-entropy times ``world_size / global_batch``
(:func:`rank_share`) so that DDP's gradient average is exactly the gradient of the global batch's mean loss, even
for a short last batch (a rank left with no post runs one with weight 0). ``batch_size`` must be a multiple of the
number of processes. Evaluation runs whole length-sorted batches round-robin over the ranks and gathers the logits
on every rank (:func:`bertlib.evaluation.inference.predict_logits`; each batch is the one a single process runs). Only
rank 0
writes ``metrics.json``, the checkpoints, the best weights and ``hf/``; every rank reads the checkpoint to resume, so
``OUT`` must be visible to all of them (always so on one machine). Rank 0 draws the dropout masks a single process
would; the other ranks draw their own (:func:`rank_seed`), so with dropout on a DDP run matches a single-process one
only statistically. With dropout off (``--dropout 0``) it matches up to the order of float reductions
(``tests/test_ddp.py``, two CPU processes: see :data:`DDP_TOLERANCE`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

#: How close a DDP run with dropout off comes to the single-process run of the same settings, float32 on CPU: each
#: global batch's gradient is summed in another order (per shard, then across ranks) and each shard is padded to
#: its own longest post. Measured with two gloo processes over the 7 steps of tests/test_ddp.py (a last batch of
#: one post included): step losses 7e-7, logits 9e-8 (absolute); weights 8e-6 (absolute, the largest in word
#: embedding rows and attention key biases, whose gradients are ~0, so that Adam's normalised step turns float
#: noise into ~lr·|g|/eps); the encoder's update (final - pretrained weights) differs by 3e-5 of its norm, where a
#: wrongly weighted loss (each rank's mean) gives 3e-2. The bounds leave 5-30x room. Not measured on GPUs, where
#: bf16 autocast makes every difference larger.
DDP_TOLERANCE = {"loss": 5e-6, "logits": 1e-6, "weights": 5e-5, "update_rel": 1e-3}


@dataclass
class Distributed:
    """This process's place in a ``torchrun`` / ``accelerate launch`` job (``world_size == 1``: not in one)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    backend: str | None = None
    owned: bool = False  # this process group was created by :func:`init_distributed`, which closes it

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.enabled:
            import torch.distributed as dist

            dist.barrier()

    @contextmanager
    def main_first(self):
        """Rank 0 runs the block first (e.g. filling scikit-learn's cache), then the others."""
        if self.enabled and not self.main:
            self.barrier()
        yield
        if self.enabled and self.main:
            self.barrier()

    def all_gather(self, obj) -> list:
        if not self.enabled:
            return [obj]
        import torch.distributed as dist

        parts: list = [None] * self.world_size
        dist.all_gather_object(parts, obj)
        return parts

    def close(self) -> None:
        if self.owned:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.owned = False


def launched_world_size() -> int:
    """How many processes a launcher started (``$WORLD_SIZE``, set by ``torchrun`` and ``accelerate launch``); 1
    without one."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def init_distributed(device: torch.device) -> Distributed:
    """Join the process group a launcher (``torchrun``, ``accelerate launch``) set up through ``WORLD_SIZE``,
    ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``: NCCL on CUDA (this process on
    ``cuda:LOCAL_RANK``), gloo on CPU. Without a launcher (or ``WORLD_SIZE=1``) returns a one-process
    :class:`Distributed` and changes nothing. A process group that is already initialised is used as it is."""
    world = launched_world_size()
    if world <= 1:
        return Distributed()
    import torch.distributed as dist

    if not dist.is_available():
        raise RuntimeError(f"WORLD_SIZE={world} but this torch build has no torch.distributed.")
    local = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
    if device.type == "cuda":
        if local >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK={local} but only {torch.cuda.device_count()} GPUs are visible: start at "
                               "most one process per GPU (torchrun --nproc_per_node=N).")
        torch.cuda.set_device(local)
    if dist.is_initialized():
        return Distributed(dist.get_rank(), dist.get_world_size(), local, dist.get_backend(), owned=False)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend=backend)  # init_method env://, as the launcher set it
    return Distributed(dist.get_rank(), dist.get_world_size(), local, backend, owned=True)


def shard_batch(batch: np.ndarray, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s share of a global batch: the ``world_size`` contiguous, disjoint pieces of
    ``np.array_split`` (equal for a full batch, whose size is a multiple of ``world_size``; a short last batch
    leaves some ranks one post fewer, or none). Together the pieces are the batch, in order."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, {world_size}), got {rank}.")
    return np.array_split(np.asarray(batch), world_size)[rank]


def rank_share(batch: np.ndarray, rank: int, world_size: int) -> tuple[np.ndarray, float]:
    """What DDP rank ``rank`` trains on for one global ``batch``: its posts (:func:`shard_batch`) and the weight of
    their *summed* loss, ``world_size / len(batch)``. DDP averages the ranks' gradients, so the result is the
    gradient of the global batch's mean loss, as in a single process, whatever the shard sizes. A rank whose share
    is empty (a last batch shorter than the world) runs the batch's first post with weight 0: it still joins the
    gradient all-reduce, adding nothing."""
    mine = shard_batch(batch, rank, world_size)
    if len(mine) == 0:
        return np.asarray(batch)[:1], 0.0
    return mine, world_size / len(batch)


def rank_seed(seed: int, rank: int, *salt: int) -> int:
    """The torch seed of DDP rank ``rank > 0`` (rank 0 keeps ``seed``): its own dropout masks."""
    return int(np.random.SeedSequence([seed, rank, *salt]).generate_state(1)[0])
