"""``python -m bertlib.training.finetune`` under ``torchrun``: two CPU processes (gloo) against one.

The setting is tiny (117 training posts: 97 to train, 20 held out; 40 test posts; 64 tokens; one epoch of 7 steps
at a global batch of 16, so 8 posts per process) and chosen so that the seventh batch holds a single post: one
rank gets it, the other none, which is the hardest case of the loss weighting. Dropout is off (with dropout on,
rank 1 draws other masks than a single process) and gradient clipping is off (``--max-grad-norm 1e9``): clipping
rescales each step's gradient to norm 1, which would hide a wrongly scaled loss from this comparison.

Two launches and one run in this process, about a minute and a half on two cores (marked ``slow``: ``make unit``
leaves them out, ``make test`` runs them):

* ``single``: the command's entry point (``bertlib.training.finetune.main``) in this process, on one thread;
* ``ddp``: ``python -m torch.distributed.run --standalone --nproc_per_node=2 -m bertlib.training.finetune`` with
  ``--stop-after-steps 3``, then the same command again, which resumes from rank 0's checkpoint on both ranks.

The two must agree within :data:`bertlib.training.distributed.DDP_TOLERANCE` (step losses, logits, weights) and predict
the same class for every post.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import bertlib
import bertlib.tasks.classifier
from bertlib.data import newsgroups
from bertlib.evaluation import inference
from bertlib.training import checkpoint, distributed
from bertlib.training import finetune as ft
from bertlib.training.finetune_config import profile_config
from helpers import finish, needs_data, one_thread

ROOT = Path(__file__).resolve().parent.parent
SETTING = ["--profile", "quick", "--train-size", "117", "--test-size", "40", "--max-length", "64", "--epochs", "1",
           "--batch-size", "16", "--eval-batch-size", "8", "--seed", "3", "--checkpoint-every", "100",
           "--device", "cpu", "--dropout", "0", "--max-grad-norm", "1e9", "--bf16", "off",  # DDP_TOLERANCE: float32's
           "--val-fraction", "0.1", "--truncation", "head_tail", "--pooling", "pooler",  # 97 posts; exported to hf/
           "--head-init", "random", "--no-eval-windows"]  # as test_finetune's tiny runs
SETTING_CFG = dict(train_size=117, test_size=40, max_length=64, epochs=1, batch_size=16, seed=3, device="cpu",
                   bf16="off", val_fraction=0.1, truncation="head_tail", pooling="pooler", head_init="random",
                   eval_windows=False)
TOL = distributed.DDP_TOLERANCE


def _gloo() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


needs_gloo = pytest.mark.skipif(not _gloo(), reason="this torch build has no torch.distributed with gloo")


def _launch(out: Path, *extra: str, nproc: int) -> subprocess.Popen:
    """``torchrun --nproc_per_node=nproc -m bertlib.training.finetune --out OUT SETTING... extra``, one CPU thread
    each."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    env.update(CI="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), BERTLIB_DEVICE="cpu")
    launcher = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return subprocess.Popen([sys.executable, *launcher, "-m", "bertlib.training.finetune", "--out", str(out), *SETTING,
                             *extra], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _single(out: Path, *extra: str) -> str:
    """The same command in this process (its entry point, one thread, no launcher); returns what it printed."""
    log = io.StringIO()
    with one_thread(), contextlib.redirect_stdout(log):
        assert ft.main(["--out", str(out), *SETTING, *extra]) == 0
    return log.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    single, ddp = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("ddp")
    stopped = _launch(ddp, "--stop-after-steps", "3", nproc=2)  # the group starts; the single run goes on meanwhile
    log_single = _single(single, "--no-export")
    log_stop = finish(stopped)
    assert (ddp / checkpoint.CHECKPOINT).exists() and not (ddp / checkpoint.METRICS).exists(), \
        "the stopped DDP run left no checkpoint"
    ckpt = checkpoint.load_checkpoint(ddp / checkpoint.CHECKPOINT)
    log_resume = finish(_launch(ddp, nproc=2))
    return {"single": single, "ddp": ddp, "log_single": log_single, "log_stop": log_stop, "log_resume": log_resume,
            "stopped_ckpt": ckpt}


def _metrics(path: Path) -> dict:
    return json.loads((path / checkpoint.METRICS).read_text())


@pytest.mark.slow
@needs_data
@needs_gloo
def test_ddp_run_writes_its_outputs_once(runs):
    m, log = _metrics(runs["ddp"]), runs["log_resume"]
    assert m["world_size"] == 2 and m["distributed_backend"] == "gloo" and m["device"] == "cpu"
    assert m["segments"] == 2 and m["steps"] == 7 and "resuming from" in log
    assert "world_size=2 backend=gloo per_rank_batch=8" in log
    assert log.count("[finetune] epoch 1/1") == 1 and log.count("[finetune] test accuracy") == 1, "rank 1 spoke"
    for name in ("model.safetensors", checkpoint.CHECKPOINT, "hf/config.json", "hf/model.safetensors"):
        assert (runs["ddp"] / name).is_file(), f"{name} missing"
    assert not list(runs["ddp"].glob("*.tmp")), "a half-written file was left behind"
    assert _metrics(runs["single"])["world_size"] == 1


@pytest.mark.slow
@needs_data
@needs_gloo
def test_each_rank_trained_on_its_own_half(runs):
    """The shards are disjoint and cover every global batch: 6 full batches of 8 + 8, then one post on rank 0."""
    single, ddp = _metrics(runs["single"]), _metrics(runs["ddp"])
    assert single["examples_per_rank"] == [97]
    assert ddp["examples_per_rank"] == [6 * 8 + 1, 6 * 8], ddp["examples_per_rank"]
    assert ddp["train_tokens"] == single["train_tokens"], "the global batches are not the single-process ones"


@pytest.mark.slow
@needs_data
@needs_gloo
def test_checkpoint_keeps_every_ranks_random_state(runs):
    ckpt = runs["stopped_ckpt"]
    assert ckpt["world_size"] == 2 and ckpt["state"]["step"] == 3 and len(ckpt["rng_ranks"]) == 2
    assert ckpt["state"]["examples_per_rank"] == [24, 24]
    r0, r1 = (s["torch"] for s in ckpt["rng_ranks"])
    assert not torch.equal(r0, r1), "ranks share one dropout stream"


@pytest.mark.slow
@needs_data
@needs_gloo
def test_two_processes_match_one(runs, pretrained):
    a, b = _metrics(runs["single"]), _metrics(runs["ddp"])
    for key in ("accuracy", "macro_f1", "per_class_f1", "best_epoch", "best_val_accuracy", "steps"):
        assert a[key] == b[key], f"{key}: single {a[key]} != DDP {b[key]}"
    assert len(a["train_loss_curve"]) == len(b["train_loss_curve"]) == 7

    def losses(m):
        return [*m["train_loss_curve"], m["history"][0]["train_loss"], m["history"][0]["val_loss"]]

    np.testing.assert_allclose(losses(b), losses(a), rtol=0, atol=TOL["loss"])

    wa, wb = load_file(str(runs["single"] / checkpoint.BEST)), load_file(str(runs["ddp"] / checkpoint.BEST))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=TOL["weights"], rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    # the encoder's update (fine-tuned - pretrained), as a whole: the same to a small fraction of its size
    start = {f"bert.{k}": v.cpu() for k, v in pretrained.state_dict.items()}

    def norm(tensors):
        return float(sum((t.double() ** 2).sum() for t in tensors) ** 0.5)

    update = norm(wa[k] - start[k] for k in start)
    assert update > 100 * TOL["weights"], f"training moved the encoder by {update:.1e} only: this proves nothing"
    rel = norm(wb[k] - wa[k] for k in start) / update
    assert rel < TOL["update_rel"], f"the encoder's update differs by {rel:.1e} of its norm"

    # logits of both models on the validation and test posts, computed here in one process
    data = newsgroups.load_data(profile_config("quick", **SETTING_CFG))
    seqs = newsgroups.encode(pretrained.tokenizer, data.val.texts + data.test.texts, 64)
    logits = []
    for w in (wa, wb):
        model = bertlib.tasks.classifier.BertClassifier(pretrained.state_dict, pretrained.config, len(data.label_names))
        model.load_state_dict(w, strict=True)
        logits.append(inference.predict_logits(model.to("cpu"), seqs, pretrained.tokenizer.pad_token_id,
                                                  inference.PredictOptions(device="cpu")))
    torch.testing.assert_close(logits[1], logits[0], atol=TOL["logits"], rtol=0)
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1)), "a prediction changed"


# --------------------------------------------------------------------------------- pieces, no processes


def test_shards_are_disjoint_and_cover_the_batch():
    for size, world in [(16, 2), (16, 4), (5, 2), (1, 2), (3, 4)]:
        batch = np.arange(100, 100 + size)
        shards = [distributed.shard_batch(batch, r, world) for r in range(world)]
        assert np.array_equal(np.concatenate(shards), batch), (size, world)  # contiguous, in order, no overlap
        assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert [len(distributed.shard_batch(np.arange(16), r, 2)) for r in range(2)] == [8, 8]
    with pytest.raises(ValueError, match="rank"):
        distributed.shard_batch(np.arange(4), 2, 2)


def test_weighted_shard_losses_average_to_the_global_mean():
    """What each rank backpropagates (its summed loss × world/n), averaged as DDP averages gradients, is the
    gradient of the global batch's mean loss, for uneven shards and for a rank that runs a post with weight 0."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 3, generator=g)
    for n, world in [(16, 2), (5, 2), (1, 2), (3, 4)]:
        x, y = torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)
        whole = w.clone().requires_grad_()
        torch.nn.functional.cross_entropy(x @ whole, y).backward()
        grads = []
        for rank in range(world):
            mine, weight = distributed.rank_share(np.arange(n), rank, world)
            part = w.clone().requires_grad_()
            (torch.nn.functional.cross_entropy(x[mine] @ part, y[mine], reduction="sum") * weight).backward()
            grads.append(part.grad)
        torch.testing.assert_close(torch.stack(grads).mean(0), whole.grad, atol=1e-6, rtol=0)


def test_batch_size_must_split_over_the_processes(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = profile_config("quick", batch_size=15, device="cpu")
    with pytest.raises(ValueError, match="not a multiple of the 2 processes"):
        ft.train(cfg, tmp_path, verbose=False)  # refused before any process group or data is touched
    assert not any(tmp_path.iterdir())


def test_no_launcher_means_one_process(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    d = distributed.init_distributed(torch.device("cpu"))
    assert (d.world_size, d.rank, d.enabled, d.main, d.backend) == (1, 0, False, True, None)
    assert d.all_gather("x") == ["x"]
