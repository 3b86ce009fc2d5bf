"""BERTLIB_SEED / BERTLIB_NUM_THREADS reach setup() and the library's defaults; claims record their margins; the
book's execution cache is emptied when bertlib changes (the rules `make sweep` and `make test` rely on)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import BertConfig

import bertlib
import bertlib.course
import bertlib.model.runtime
from bertbook import cachekey
from bertlib.course import claims
from bertlib.training import finetune_config
from bertlib.training import pretraining as P
from bertlib.training.finetune_config import profile_config
from sweep import table


def test_seed_from_environment(monkeypatch, capsys):
    monkeypatch.delenv("BERTLIB_SEED", raising=False)
    assert bertlib.model.runtime.default_seed() == 0 and finetune_config.FinetuneConfig().seed == 0
    monkeypatch.setenv("BERTLIB_SEED", "7")
    threads = torch.get_num_threads()
    try:
        S = bertlib.course.setup()
        assert S.seed == 7 and "seed=7 " in capsys.readouterr().out
        assert bertlib.course.setup(seed=3, verbose=False).seed == 3                      # an explicit seed wins
        cfg = profile_config("quick")
        assert (cfg.seed, cfg.data_seed) == (7, 7)                                 # training and data split
        config = BertConfig(vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=16, max_position_embeddings=8)
        a, b = P.init_state_dict(config), P.init_state_dict(config, seed=7)
        assert all(torch.equal(a[k], b[k]) for k in a)                             # initialisation follows it
        assert not torch.equal(P.init_state_dict(config, seed=8)["embeddings.word_embeddings.weight"],
                               a["embeddings.word_embeddings.weight"])
        monkeypatch.setenv("BERTLIB_NUM_THREADS", "1")
        assert bertlib.course.setup(verbose=False).threads == 1 == torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("name, value", [("BERTLIB_SEED", "one"), ("BERTLIB_NUM_THREADS", "0")])
def test_bad_settings_are_named(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        bertlib.course.setup(verbose=False)


def test_assert_margin_records_and_fails(monkeypatch, tmp_path):
    path = tmp_path / "margins.jsonl"
    monkeypatch.setenv("BERTLIB_MARGINS", str(path))
    monkeypatch.setenv("BERTLIB_SEED", "2")
    assert claims.assert_margin("above", 0.7, 0.5) == pytest.approx(0.2)
    assert claims.assert_margin("below", 0.3, 0.5, above=False) == pytest.approx(0.2)
    with pytest.raises(AssertionError, match="the claim needs > 0.9"):
        claims.assert_margin("failing", 0.7, 0.9)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["name"], r["relation"], r["seed"]) for r in rows] == [("above", ">", 2), ("below", "<", 2),
                                                                      ("failing", ">", 2)]
    assert rows[2]["margin"] == pytest.approx(-0.2)                               # a failure is recorded too
    assert all(r["asserted"] for r in rows)


def test_sweep_table(tmp_path):
    rows = [dict(name="c", observed=o, bound=0.5, margin=o - 0.5, relation=">", seed=s, threads=t)
            for o, s, t in [(0.7, 0, 2), (0.6, 1, 2), (0.9, 0, 1)]]
    line = table(rows).splitlines()[-1]
    assert "0.6 – 0.9" in line and "0.1 (seed 1, 2 threads)" in line and "20.0%" in line
    assert line.endswith("| 3 | yes |")
    reported = [dict(r, name="r", asserted=False) for r in rows]                 # claims.record: reported, not asserted
    assert table(reported).splitlines()[-1].endswith("| 3 | no, reported |")


def test_execution_cache_emptied_when_bertlib_changes(tmp_path):
    root = tmp_path / "book"
    (root / "bertlib").mkdir(parents=True)
    (root / "bertlib" / "x.py").write_text("A = 1\n")
    (root / "pyproject.toml").write_text("")
    cache = root / "_build" / ".jupyter_cache"
    assert not cachekey.ensure_fresh(cache, root)                                 # new: nothing to empty
    (cache / "executed").mkdir()
    assert not cachekey.ensure_fresh(cache, root) and (cache / "executed").exists()   # same code: kept
    (root / "bertlib" / "x.py").write_text("A = 2\n")
    assert cachekey.ensure_fresh(cache, root) and not (cache / "executed").exists()  # changed: emptied
