"""Every ``bertlib`` name a chapter uses still exists and is not a deprecated alias (a warning printed in a notebook
goes to stderr and fails the book build); the old aliases live in ``bertlib.compat``, warn, and still compute what
the real names compute; the ones nothing called are gone."""

from __future__ import annotations

import ast
import importlib
import json
import types
import warnings

import pytest
import torch

import bertlib
from bertlib import compat
from bertlib import head_pruning as HP
from bertlib import relative_position as R
from bertlib import unpadded as U
from helpers import random_inputs, random_model
from toc import ROOT


def chapter_names() -> dict[str, set[str]]:
    """Dotted ``bertlib`` names each chapter reads (``bertlib.x.y``, ``from bertlib.x import y``, through aliases
    such as ``from bertlib import finetune as ft``): name → chapters."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / "chapters").glob("*.ipynb")):
        cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        code = "\n".join(line for c in cells for line in "".join(c["source"]).splitlines()
                         if not line.lstrip().startswith(("%", "!")))
        tree, alias = ast.parse(code), {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] == "bertlib":
                        alias[a.asname or "bertlib"] = a.name if a.asname else "bertlib"
                        found.setdefault(a.name, set()).add(path.stem)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bertlib":
                for a in node.names:
                    alias[a.asname or a.name] = f"{node.module}.{a.name}"
                    found.setdefault(f"{node.module}.{a.name}", set()).add(path.stem)

        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (name := _dotted(node, alias)):
                found.setdefault(name, set()).add(path.stem)
    return found


def _dotted(node: ast.AST, alias: dict[str, str]) -> str | None:
    """``ft.train`` → ``bertlib.finetune.train`` when ``ft`` names a bertlib module; None for anything else."""
    if isinstance(node, ast.Name):
        return alias.get(node.id)
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value, alias)):
        return f"{base}.{node.attr}"
    return None


def resolve(name: str):
    """The object a dotted name stands for: the longest importable module, then attributes."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def test_every_name_a_chapter_uses_exists_and_is_not_deprecated():
    names = chapter_names()
    assert "bertlib.bert_forward" in names and "bertlib.finetune.train" in names, "the chapter scan finds nothing"
    missing, deprecated = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning on access fails here, as it would fail the book
        for name, chapters in sorted(names.items()):
            try:
                obj = resolve(name)
            except AttributeError:
                if isinstance(resolve(name.rsplit(".", 1)[0]), types.ModuleType):
                    missing.append(f"{name} ({', '.join(sorted(chapters))})")
                continue  # else an attribute of an object (a dataclass field, a tensor method): not a bertlib name
            if getattr(obj, "__module__", None) == "bertlib.compat":
                deprecated.append(f"{name} ({', '.join(sorted(chapters))})")
    assert not missing, f"chapters use bertlib names that are gone: {missing}"
    assert not deprecated, f"chapters use deprecated aliases (they warn): {deprecated}"


def test_old_aliases_warn_and_compute_what_bert_forward_computes():
    sd, config, _ = random_model(seed=2, position_embedding_type="relative_key_query")
    sd = R.add_distance_embeddings(sd, config, seed=3, std=0.1)
    batch = random_inputs(config, batch=2, seq=7, seed=4)
    ref = bertlib.bert_forward(sd, config, **batch).last_hidden_state
    with pytest.warns(DeprecationWarning, match="use bertlib.bert_forward"):
        out = R.relative_bert_forward(sd, config, **batch)  # the old path finds it in bertlib.compat
    assert torch.equal(out.last_hidden_state, ref) and R.relative_bert_forward is compat.relative_bert_forward
    plain, plain_config, _ = random_model(seed=2)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="position_embedding_type"):
        compat.relative_bert_forward(plain, plain_config, **batch)  # it still insists on a relative config
    pruned, pruned_config = HP.prune(plain, plain_config, {0: [1]})
    with pytest.warns(DeprecationWarning, match="use bertlib.bert_forward"):
        out = HP.pruned_bert_forward(pruned, pruned_config, **batch)
    assert torch.equal(out.last_hidden_state, bertlib.bert_forward(pruned, pruned_config, **batch).last_hidden_state)
    x = torch.randn(2, 7, config.hidden_size)
    with pytest.warns(DeprecationWarning, match="use bertlib.self_attention"):
        ctx, probs = R.relative_self_attention(sd, config, x, layer=1)
    ref_ctx, ref_probs = bertlib.self_attention(sd, config, x, layer=1)
    assert torch.equal(ctx, ref_ctx) and torch.equal(probs, ref_probs)
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="position_embedding_type"):
        compat.relative_self_attention(plain, plain_config, x)
    with pytest.warns(DeprecationWarning, match="attn_implementation='unpadded'"):
        out = U.bert_forward_unpadded(plain, plain_config, **batch)
    ref = bertlib.bert_forward(plain, plain_config, **batch, attn_implementation="unpadded", fused=True)
    assert torch.equal(out.last_hidden_state, ref.last_hidden_state)


def test_aliases_nothing_called_are_gone():
    for module, name in [(HP, "prune_heads"), (HP, "pruned_self_attention"), (R, "relative_embeddings")]:
        assert not hasattr(module, name), f"{module.__name__}.{name}"
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        R.nothing  # noqa: B018  (the module __getattr__ still raises for other names)
