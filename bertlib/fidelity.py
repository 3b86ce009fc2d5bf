"""``python -m bertlib.fidelity``: how far bertlib is from transformers, layer by layer, on this machine.

Prints a markdown table of max |diff| against ``transformers.BertModel`` (eager) for every hidden state, the
attention probabilities and the pooler output, on real 20 Newsgroups sentences in a padded batch, for each dtype
asked for. Real (non-padding) positions only: see ``tests/test_fidelity.py`` for why.
"""

from __future__ import annotations

import argparse
import json

import torch

from .data import example_sentences
from .encoder import bert_forward
from .pretrained import load_pretrained, to_hf_model
from .runtime import setup, tolerance


def max_diffs(pretrained, texts: list[str], device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """``{"hidden_states[i]": ..., "attentions[i]": ..., "pooler_output": ...}``: max |ours - HF| at real positions."""
    sd = {k: v.to(device=device, dtype=dtype) for k, v in pretrained.state_dict.items()}
    hf = to_hf_model(pretrained).to(device=device, dtype=dtype)
    enc = pretrained.tokenizer(texts, padding=True, return_tensors="pt").to(device)
    real = enc["attention_mask"].bool()
    with torch.no_grad():
        ours = bert_forward(sd, pretrained.config, **enc)
        ref = hf(**enc, output_hidden_states=True, output_attentions=True)
    rows = {f"hidden_states[{i}]": (a - b)[real].abs().max().item()
            for i, (a, b) in enumerate(zip(ours.hidden_states, ref.hidden_states, strict=True))}
    for i, (a, b) in enumerate(zip(ours.attentions, ref.attentions, strict=True)):
        rows[f"attentions[{i}]"] = (a - b).transpose(1, 2)[real].abs().max().item()  # real query rows
    rows["pooler_output"] = (ours.pooler_output - ref.pooler_output).abs().max().item()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="local directory or Hub id (default: $BERTLIB_MODEL or MiniLM)")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--sentences", type=int, default=8)
    parser.add_argument("--json", default=None, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    device = setup().device
    pretrained = load_pretrained(args.model)
    texts = example_sentences(args.sentences)
    table = {name: max_diffs(pretrained, texts, device, getattr(torch, name)) for name in args.dtypes.split(",")}
    names = list(table)
    print("| tensor | " + " | ".join(f"max abs diff, {n}" for n in names) + " |")
    print("| --- |" + " --- |" * len(names))
    for key in table[names[0]]:
        print(f"| {key} | " + " | ".join(f"{table[n][key]:.2e}" for n in names) + " |")
    print("| **asserted tolerance** | "
          + " | ".join(f"{tolerance(device, getattr(torch, n))['atol']:.0e}" for n in names) + " |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(device), "model": pretrained.source, "max_abs_diff": table}, f, indent=2)


if __name__ == "__main__":
    main()
