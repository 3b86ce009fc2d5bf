"""``bertlib-fidelity`` (``python -m bertlib.evaluation.fidelity``, ``make fidelity``): how far bertlib is from
transformers, layer by layer.

Prints a markdown table of the max |diff| against ``transformers.BertModel`` (eager) for every hidden state (the
embeddings, then each layer), every layer's attention probabilities and the pooler output, on real 20 Newsgroups
sentences in a padded batch, for each dtype asked for (``--dtypes``) and each of bertlib's attention functions
(``--attn``: ``eager``, ``sdpa``, ``head_loop``, ``unpadded``; the fused kernels form no probabilities, so their
attention rows are empty). Real (non-padding) positions only: see ``tests/test_fidelity.py`` for why. The last row
is the tolerance the book asserts (:func:`bertlib.tolerance`). Used to re-measure the numbers quoted in chapter 7.
"""

from __future__ import annotations

import argparse
import json

import torch

from bertlib.data.corpus import example_sentences
from bertlib.data.files import check_output
from bertlib.model.encoder import bert_forward
from bertlib.model.pretrained import Pretrained, load_pretrained, to_hf_model
from bertlib.model.runtime import TOLERANCES, configure, tolerance


def max_diffs(pretrained: Pretrained, texts: list[str], device: torch.device, dtype: torch.dtype,
              attn_implementation: str = "eager") -> dict[str, float | None]:
    """``{"hidden_states[i]": ..., "attentions[i]": ..., "pooler_output": ...}``: max |ours - HF| at real
    positions (``None`` where bertlib's attention function forms no probabilities)."""
    sd = {k: v.to(device=device, dtype=dtype) for k, v in pretrained.state_dict.items()}
    hf = to_hf_model(pretrained).to(device=device, dtype=dtype)
    enc = pretrained.tokenizer(texts, padding=True, return_tensors="pt").to(device)
    real = enc["attention_mask"].bool()
    with torch.no_grad():
        ours = bert_forward(sd, pretrained.config, **enc, attn_implementation=attn_implementation)
        ref = hf(**enc, output_hidden_states=True, output_attentions=True)
    rows: dict[str, float | None] = {
        f"hidden_states[{i}]": (a - b)[real].abs().max().item()
        for i, (a, b) in enumerate(zip(ours.hidden_states, ref.hidden_states, strict=True))}
    for i, (a, b) in enumerate(zip(ours.attentions, ref.attentions, strict=True)):
        rows[f"attentions[{i}]"] = None if a is None else (a - b).transpose(1, 2)[real].abs().max().item()
    rows["pooler_output"] = (ours.pooler_output - ref.pooler_output).abs().max().item()
    return rows


def report(table: dict[str, dict[str, float | None]], device: torch.device) -> str:
    """The markdown table: one row per tensor, one column per ``dtype/attn_implementation``."""
    names = list(table)
    lines = ["| tensor | " + " | ".join(f"max abs diff, {n}" for n in names) + " |", "| --- |" + " --- |" * len(names)]
    for key in table[names[0]]:
        cells = ["" if table[n][key] is None else f"{table[n][key]:.2e}" for n in names]
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    tols = [f"{tolerance(device, getattr(torch, n.split('/')[0]))['atol']:.0e}" for n in names]
    lines.append("| **asserted tolerance** | " + " | ".join(tols) + " |")
    return "\n".join(lines)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace, device: torch.device) -> None:
    """Refuse, before the model is loaded, a dtype without a stated tolerance on ``device`` (float16 on CPU), an
    unknown dtype or attention function, too few sentences and an unwritable ``--json`` (``parser.error``)."""
    from bertlib.model.attention_functions import ATTENTION_FUNCTIONS

    for name in args.dtypes.split(","):
        dtype = getattr(torch, name, None)
        if not isinstance(dtype, torch.dtype):
            parser.error(f"--dtypes: {name!r} is not a torch dtype; use float32, float64, bfloat16 or float16.")
        try:
            tolerance(device, dtype)
        except ValueError:
            known = sorted(str(d).removeprefix("torch.") for t, d in TOLERANCES if t == device.type)
            parser.error(f"--dtypes: {name} has no stated tolerance on {device.type} (its kernels are not run "
                         f"there or not checked): use {', '.join(known)}.")
    for name in args.attn.split(","):
        if name not in ATTENTION_FUNCTIONS:
            parser.error(f"--attn: {name!r} is not one of bertlib's attention functions {sorted(ATTENTION_FUNCTIONS)}.")
    if args.sentences < 2:
        parser.error(f"--sentences must be at least 2, got {args.sentences}: a padded batch needs sentences of "
                     "different lengths, so that both real and padding positions are compared.")
    if args.json:
        try:
            check_output(args.json, "--json")
        except ValueError as err:
            parser.error(str(err))


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local directory or Hub id (default: $BERTLIB_MODEL or MiniLM)")
    parser.add_argument("--dtypes", default="float32,float64",
                        help="comma-separated dtypes with a stated tolerance on the device (bertlib.tolerance): "
                             "float32, float64, bfloat16; float16 on CUDA only")
    parser.add_argument("--attn", default="eager", help="comma-separated attention functions (eager,sdpa,...)")
    parser.add_argument("--sentences", type=int, default=8, help="real sentences in the padded batch (at least 2: "
                                                                 "one padded, one not)")
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    device = configure().device
    check_args(parser, args, device)
    pretrained = load_pretrained(args.model)
    texts = example_sentences(args.sentences)
    table = {f"{dt}/{attn}": max_diffs(pretrained, texts, device, getattr(torch, dt), attn)
             for dt in args.dtypes.split(",") for attn in args.attn.split(",")}
    print(report(table, device))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "model": pretrained.source, "max_abs_diff": table}, f, indent=2)
    return table


def cli() -> int:
    """The ``bertlib-fidelity`` command (``[project.scripts]``): :func:`main` (which returns its tables), exit 0."""
    main()
    return 0


if __name__ == "__main__":
    main()
