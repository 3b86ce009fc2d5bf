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



def _checkpoint(seed: int, name: str, **overrides):
    """A stand-in for bertlib.Pretrained: the state dict, the config and a name, as checkpoint_claim reads them."""
    from types import SimpleNamespace

    from helpers import random_model

    sd, config, _ = random_model(seed, **overrides)
    return SimpleNamespace(state_dict=sd, config=config, name=name)


def test_checkpoint_fingerprint_names_the_weights_not_the_place():
    a, same, other, wider = (_checkpoint(0, "a"), _checkpoint(0, "copied elsewhere"), _checkpoint(1, "a"),
                             _checkpoint(0, "a", num_attention_heads=6))
    fp = claims.checkpoint_fingerprint(a.state_dict, a.config)
    assert fp == claims.checkpoint_fingerprint(same.state_dict, same.config)        # another name, same weights
    assert fp != claims.checkpoint_fingerprint(other.state_dict, other.config)      # other weights
    assert fp != claims.checkpoint_fingerprint(wider.state_dict, wider.config)      # same weights, other heads
    moved = dict(a.state_dict, **{"pooler.dense.bias": torch.ones(48)})              # a pooler drawn at random
    assert fp == claims.checkpoint_fingerprint(moved, a.config)
    one_weight = dict(a.state_dict)
    one_weight["encoder.layer.1.output.dense.bias"] = one_weight["encoder.layer.1.output.dense.bias"] + 1e-6
    assert fp != claims.checkpoint_fingerprint(one_weight, a.config)


def test_checkpoint_claim_asserts_where_measured_and_reports_elsewhere(monkeypatch, tmp_path, capsys):
    path = tmp_path / "margins.jsonl"
    monkeypatch.setenv("BERTLIB_MARGINS", str(path))
    measured, unmeasured = _checkpoint(0, "measured-bert"), _checkpoint(1, "another-bert")
    registry = {claims.checkpoint_fingerprint(measured.state_dict, measured.config): "measured-bert"}

    obs = claims.checkpoint_claim("head over chance", 18.0, 5.0, measured, measured=registry)
    assert obs.asserted and obs.holds and obs.margin == pytest.approx(13.0)
    assert obs.status == "asserted, since this page runs on measured-bert"
    # the same claim failing on the measured checkpoint is an error: the policy can fail
    with pytest.raises(AssertionError, match="head over chance"):
        claims.checkpoint_claim("head over chance", 3.6, 5.0, measured, measured=registry)
    # on a checkpoint whose margin nobody measured, a miss is reported, glued and recorded, never raised
    obs = claims.checkpoint_claim("head over chance", 3.6, 5.0, unmeasured, measured=registry)
    assert not obs.asserted and not obs.holds and obs.checkpoint == "another-bert"
    assert str(obs).startswith("3.6 (misses the bound > 5)") and "measured on measured-bert" in str(obs)
    assert obs.status == "reported but not asserted, since this page runs on another-bert, which is not one of them"
    assert "reported, not asserted" in capsys.readouterr().out
    upper = claims.checkpoint_claim("gap at the embeddings", 0.01, 0.05, unmeasured, above=False, measured=registry)
    assert upper.holds and str(upper).startswith("0.01 (meets the bound < 0.05)")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["asserted"] for r in rows] == [True, True, False, False]
    assert rows[2]["margin"] == pytest.approx(-1.4)


def test_measured_checkpoints_are_the_two_real_ones():
    import bertlib
    import bertlib.course
    import bertlib.model.runtime

    default = bertlib.load_pretrained()
    assert claims.measured_checkpoint(default) == "all-MiniLM-L6-v2"
    assert sorted(claims.MEASURED_CHECKPOINTS.values()) == ["all-MiniLM-L6-v2", "paraphrase-MiniLM-L3-v2"]


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
