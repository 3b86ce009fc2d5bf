"""The end of a fine-tuning run (chapter 9): the best epoch's weights on the test posts (:func:`finish`), what
``metrics.json`` records (:func:`run_metrics`) and the error analysis beside it (:func:`error_analysis`: the
confusion matrix, accuracy by post length, the same weights on truncated posts, the TF-IDF baselines and the
ensemble). Validation and test go through :func:`evaluate_split` during training too."""

from __future__ import annotations

import json
import platform

import torch
import transformers

from bertlib.data.files import write_text
from bertlib.data.newsgroups import encode, token_counts
from bertlib.evaluation.ensemble import accuracy_by_length, ensemble_report
from bertlib.evaluation.inference import PredictOptions, evaluate
from bertlib.model.runtime import hardware
from bertlib.tasks.export import export_hf
from bertlib.training.checkpoint import BEST, METRICS, load_weights
from bertlib.training.finetune_state import FinetuneResult, Run
from bertlib.training.optimization import warmup_steps


def evaluate_split(run: Run, split: str) -> tuple[dict, torch.Tensor]:
    """:func:`evaluate` on ``"val"`` or ``"test"``: truncated posts, or whole posts in windows (``eval_windows``)."""
    return evaluate(run.model, run.seqs[split], getattr(run.data, split).labels, run.data.label_names,
                    run.pretrained.tokenizer.pad_token_id, post_index=run.post_index.get(split),
                    window_pool=run.cfg.window_pool, options=predict_options(run))


def predict_options(run: Run) -> PredictOptions:
    """How the run predicts: its evaluation batch size, device, DDP rank and bfloat16 setting."""
    return PredictOptions(run.cfg.eval_batch_size, run.device, run.ddp.rank, run.ddp.world_size, run.bf16)


def finish(run: Run, export: bool) -> FinetuneResult:
    """The best epoch's weights on the test posts; ``metrics.json`` (and ``hf/``) written by rank 0."""
    ddp = run.ddp
    ddp.barrier()  # rank 0 has written the best weights
    load_weights(run.model, run.out / BEST)
    run.model.eval()
    test, test_logits = evaluate_split(run, "test")
    test.pop("loss")
    analysis = error_analysis(run, test_logits)
    run.state.wall_time = run.elapsed()
    metrics = {**run_metrics(run, test), **analysis}
    run.model.config = run.pretrained.config  # the model's own dropout values, for export and for the caller
    if ddp.main:
        if export and run.model.pooling != "pooler":  # BertForSequenceClassification reads the pooler
            run.say(f"[finetune] not exported to {run.out / 'hf'}: pooling={run.model.pooling!r} is not Hugging "
                    "Face's BertForSequenceClassification; train with --pooling pooler to export.")
        elif export:
            export_hf(run.model, run.pretrained.tokenizer, run.data.label_names, run.out / "hf")
        write_text(run.out / METRICS, json.dumps(metrics, indent=2) + "\n")
    st = run.state
    run.say(f"[finetune] test accuracy {test['accuracy']:.4f} macro_f1 {test['macro_f1']:.4f} "
            f"(best epoch {st.best_epoch}, val_acc {st.best_val_accuracy:.4f}); wall {metrics['wall_time_s']:.0f}s, "
            f"{metrics['tokens_per_s']:,.0f} train tok/s; wrote {run.out / METRICS}")
    ddp.barrier()  # every rank returns once the files are written
    return FinetuneResult(metrics, run.model, run.pretrained.tokenizer, run.data, test_logits,
                          test_logits.argmax(-1).numpy(), run.out, st.history)


def error_analysis(run: Run, test_logits: torch.Tensor) -> dict:
    """For ``metrics.json``: the test confusion matrix (counts, rows the true class), accuracy by post length
    (:func:`bertlib.evaluation.ensemble.accuracy_by_length`), every row's predicted class of every test post
    (``"test_predictions"``: ``index``, ``labels`` and one list per row); with ``eval_windows`` the same weights'
    scores on truncated posts (``"truncated"``, validation and test); with ``tfidf_ensemble`` the TF-IDF baselines
    and the ensemble (:func:`bertlib.evaluation.ensemble.ensemble_report`; it needs the best weights' validation logits
    too)."""
    from sklearn.metrics import confusion_matrix

    d = run.data
    preds, out = {"model": test_logits.argmax(-1).numpy()}, {}
    if run.cfg.eval_windows:  # the same weights on head+tail-truncated posts: what windows changed
        cut = {split: evaluate(run.model, encode(run.pretrained.tokenizer, getattr(d, split).texts, run.cfg.max_length,
                                                 run.cfg.truncation), getattr(d, split).labels, d.label_names,
                               run.pretrained.tokenizer.pad_token_id, options=predict_options(run))
               for split in ("val", "test")}
        preds["model_truncated"] = cut["test"][1].argmax(-1).numpy()
        out["truncated"] = {k: cut["test"][0][k] for k in ("accuracy", "macro_f1", "per_class_f1")}
        out["truncated"]["val_accuracy"] = cut["val"][0]["accuracy"]
    if run.cfg.tfidf_ensemble:
        val_logits = run.best_val_logits if run.best_val_logits is not None else evaluate_split(run, "val")[1]
        out["baselines"], more = ensemble_report(d, val_logits, test_logits, say=run.say)
        preds.update(more)
    out["confusion_matrix"] = confusion_matrix(d.test.labels, preds["model"],
                                               labels=range(len(d.label_names))).tolist()
    lengths = token_counts(run.pretrained.tokenizer, d.test.texts)
    out["accuracy_by_length"] = accuracy_by_length(lengths, d.test.labels, preds)
    # every row's predicted class of every test post (in d.test's order, with the true classes and the posts'
    # indices in scikit-learn's test split): paired differences and their bootstrap intervals need them (chapter 9b)
    out["test_predictions"] = {"index": [int(i) for i in d.test.index], "labels": [int(y) for y in d.test.labels],
                               **{name: [int(c) for c in p] for name, p in preds.items()}}
    return out


def run_metrics(run: Run, test: dict) -> dict:
    """``metrics.json``: the test scores, the run's history and what it ran on."""
    cfg, st, data, device = run.cfg, run.state, run.data, run.device
    return {
        **test,
        "profile": cfg.profile, "device": device.type if run.ddp.enabled else str(device),
        "hardware": hardware(device, run.ddp.world_size),
        "world_size": run.ddp.world_size, "distributed_backend": run.ddp.backend,
        "examples_per_rank": st.examples_per_rank,  # training posts each process ran (this segment on)
        "epochs": cfg.epochs, "epochs_run": st.epoch, "steps": st.step, "best_epoch": st.best_epoch,
        "best_val_accuracy": st.best_val_accuracy,
        "head_init": cfg.head_init, "probe": st.probe,  # the linear probe the new layer started from, if any
        "final_train_loss": st.history[-1]["train_loss"],
        "wall_time_s": st.wall_time,  # loading, training, evaluation: every segment of a resumed run
        "train_time_s": st.train_time,
        "tokens_per_s": st.tokens / max(st.train_time, 1e-9),  # all processes together
        "train_tokens": st.tokens,
        "history": st.history,
        "train_loss_curve": st.loss_curve,  # the loss of every optimizer step (the global batch's mean)
        "seed": cfg.seed, "data_seed": cfg.data_seed, "max_length": cfg.max_length, "truncation": cfg.truncation,
        "eval_windows": cfg.eval_windows, "window_stride": cfg.window_stride, "window_pool": cfg.window_pool,
        "test_windows": len(run.seqs["test"]) if cfg.eval_windows else None,
        "train_windows": len(run.seqs["train"]) if cfg.train_windows else None,
        "tfidf_ensemble": cfg.tfidf_ensemble,
        "remove_headers": cfg.remove_headers, "remove": list(data.remove),
        "train_size": len(data.train), "val_size": len(data.val), "test_size": len(data.test),
        "hyperparameters": {k: getattr(cfg, k) for k in ("batch_size", "lr", "head_lr", "weight_decay",
                                                         "warmup_ratio", "max_grad_norm", "max_steps",
                                                         "bucket_batches", "attn", "dropout")},
        "warmup_steps": warmup_steps(run.total_steps, cfg.warmup_ratio),
        "precision": "bf16 autocast" if run.bf16 else "float32",
        "model": run.pretrained.name,  # its name, never a path on the machine that ran it
        "segments": st.segments, "command": run.command,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version()},
    }
