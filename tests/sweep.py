"""``make sweep``: run the chapters whose claims depend on a seed, a thread count or a clock, under several seeds and
with one torch thread, and report each claim's worst margin.

A claim such as "the held-out NSP loss fell" or "batched attention is faster" holds on a reader's machine only if
it holds for other seeds and other float reduction orders (one torch thread sums in another order: a stand-in for
another CPU). Every run executes the chapters under nbval with ``BERTLIB_SEED`` and ``BERTLIB_NUM_THREADS`` set;
the chapters assert such claims with :func:`bertlib.course.claims.assert_margin`, which appends each observation to
``$BERTLIB_MARGINS``. The table (``_build/sweep/margins.md``) gives, per claim, the bound, the range of observed
values and the worst margin over all runs. The command fails if any run fails.

    python tests/sweep.py                       # seeds 0-4 with the default threads, and seed 0 with one thread
    python tests/sweep.py --seeds 0 1 --one-thread-seeds 5 --chapters chapters/11b_pretraining_from_scratch.ipynb
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The chapters whose assertions depend on random draws, training or timing: now every chapter, since each one reads
#: example sentences drawn by the seed (``bertlib.data.corpus.example_sentences``).
CHAPTERS = {
    "00_what_bert_is_for": "posts sampled by the seed; a linear probe on frozen vectors against chance",
    "01_tokenization": "example sentences drawn by the seed",
    "02_embeddings": "random permutations of the tokens",
    "03_layer_norm": "dropout masks; small stacks trained with and without LayerNorm",
    "04_attention_head": "random inputs; which head looks at the previous token",
    "05_multi_head_attention": "timing: per-head loop vs batched vs SDPA; one head vs several trained on a toy task",
    "06_encoder_layer": "update ratios and cosines over sentences drawn by the seed",
    "07_encoder": "token-pair cosines by depth over sentences drawn by the seed",
    "08_pooler": "dropout; a randomly initialised classifier",
    "09_20newsgroups": "fine-tuning against TF-IDF and frozen features",
    "10_pipeline": "a short fine-tuning run",
    "11_pretraining": "MLM masking proportions over tokens masked by the seed; NSP pairs drawn by the seed",
    "11b_pretraining_from_scratch": "a small BERT pre-trained (MLM, NSP); fine-tuning from pre-trained vs random",
    "12_numpy_bert": "example sentences drawn by the seed",
    "13_hf_attention": "head importance and pruning; random relative-position tables",
    "14_making_it_fast": "timing: fused kernels, SDPA, padding-free batches",
    "15_bert_family": "fill-mask pre-training and a capitalisation head trained against their baselines",
    "15b_span_and_tag_tasks": "span and tagging heads trained on frozen features against rule and per-word baselines",
}


def run(chapters: list[str], seed: int, threads: int | None, out: Path) -> tuple[bool, float]:
    """One nbval run of ``chapters`` under ``seed`` (and ``threads``); its log goes to ``out``."""
    env = dict(os.environ, BERTLIB_SEED=str(seed), BERTLIB_MARGINS=str(out / "margins.jsonl"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))  # this bertlib
    env.pop("BERTLIB_NUM_THREADS", None)
    if threads:
        env["BERTLIB_NUM_THREADS"] = str(threads)
    name = f"seed{seed}" + (f"-threads{threads}" if threads else "")
    cmd = [sys.executable, "-m", "pytest", *chapters, "--nbval-lax", "--nbval-current-env", "-q", "-p",
           "no:cacheprovider", f"--junitxml={out / name}.xml"]
    start = time.perf_counter()
    with open(out / f"{name}.log", "w") as log:
        ok = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode == 0
    return ok, time.perf_counter() - start


def table(rows: list[dict]) -> str:
    """Markdown: per claim, the bound, observed range, worst margin (absolute and relative to the bound), runs."""
    by_claim: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_claim[r["name"]].append(r)
    lines = ["| claim | needs | observed (min – max) | worst margin | worst margin / bound | runs | asserted |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, rs in sorted(by_claim.items()):
        worst = min(rs, key=lambda r: r["margin"])
        bounds = {r["bound"] for r in rs}
        bound = f"{worst['relation']} {worst['bound']:.4g}" + (" (varies)" if len(bounds) > 1 else "")
        rel = f"{worst['margin'] / abs(worst['bound']):.1%}" if worst["bound"] else "—"
        obs = [r["observed"] for r in rs]
        configs = sorted({(r["seed"], r["threads"]) for r in rs})
        lines.append(f"| {name} | {bound} | {min(obs):.4g} – {max(obs):.4g} | {worst['margin']:.4g} "
                     f"(seed {worst['seed']}, {worst['threads']} threads) | {rel} | {len(configs)} | "
                     f"{'yes' if all(r.get('asserted', True) for r in rs) else 'no, reported'} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    parser.add_argument("--one-thread-seeds", type=int, nargs="*", default=[0],
                        help="seeds to run again with torch.set_num_threads(1)")
    parser.add_argument("--chapters", nargs="*", default=[f"chapters/{c}.ipynb" for c in CHAPTERS])
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "sweep")
    parser.add_argument("--report-only", action="store_true",
                        help="run nothing: print the table of the observations already in OUT/margins.jsonl (e.g. "
                             "after appending those of a `BERTLIB_MARGINS=... make test` run)")
    args = parser.parse_args()
    args.out = args.out.resolve()  # the kernels run in chapters/: a relative path would miss
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        args.seeds, args.one_thread_seeds = [], []
    else:
        (args.out / "margins.jsonl").unlink(missing_ok=True)
    runs = [(s, None) for s in args.seeds] + [(s, 1) for s in args.one_thread_seeds]
    if runs:
        print(f"sweep: {len(runs)} runs of {len(args.chapters)} chapters; logs in {args.out}", flush=True)
    failed = []
    for seed, threads in runs:
        ok, seconds = run(args.chapters, seed, threads, args.out)
        label = f"seed={seed} threads={threads or 'default'}"
        print(f"sweep: {label}: {'passed' if ok else 'FAILED'} in {seconds:.0f} s", flush=True)
        if not ok:
            failed.append(label)
    path = args.out / "margins.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    md = table(rows)
    (args.out / "margins.md").write_text(md + "\n")
    print(md)
    if failed:
        print(f"sweep: failed runs: {', '.join(failed)} (see the logs in {args.out})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
