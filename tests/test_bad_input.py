"""The commands and loaders refuse bad input before the work, with an error that names the problem and the fix
(issue 36, section 3: the 16 rows of its table), and the robustness faults it lists stay fixed."""

from __future__ import annotations

import dataclasses
import io
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import get_args, get_type_hints

import numpy as np
import pytest
import torch
from transformers import BertConfig, DistilBertConfig, RobertaConfig

import bertlib
import bertlib.model.pretrained
import bertlib.tasks.classifier
from bertlib.course import claims
from bertlib.data import corpus as data
from bertlib.data import files, newsgroups
from bertlib.evaluation import fidelity
from bertlib.model import runtime
from bertlib.perf import bench
from bertlib.training import finetune as ft
from bertlib.training import finetune_config as fc
from helpers import random_inputs, random_model, tar_gz

NO_GPU = not torch.cuda.is_available()


class Loaded(Exception):
    """Raised by a stand-in for the model loader: the command got past its checks and began the work."""


@pytest.fixture
def no_loading(monkeypatch):
    """The commands' model loaders raise :class:`Loaded`: a check that passes shows as Loaded, not as work."""
    def refuse(*args, **kwargs):
        raise Loaded
    for module in (bench, fidelity, ft):
        monkeypatch.setattr(module, "load_pretrained", refuse)


def usage_error(capsys, main, argv) -> str:
    """``main(argv)`` exits with argparse's status 2 before loading anything; returns what it printed."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


# ---- rows 1, 2, 4, 15, 16: the fine-tuning settings ----------------------------------------------------------------


def test_row1_profile_cpu_from_the_environment(monkeypatch):
    """BERTLIB_PROFILE=cpu python -m bertlib.training.finetune: the cpu profile, as --profile cpu (was a traceback)."""
    monkeypatch.setenv("BERTLIB_PROFILE", "cpu")
    assert runtime.get_profile() == "cpu"
    cfg, _ = fc.parse_args(["--out", "x"])
    assert cfg == fc.profile_config("cpu") and cfg.train_size is None and cfg.tfidf_ensemble


def test_row2_train_size_too_small_for_stratified_splits(capsys):
    err = usage_error(capsys, fc.parse_args, ["--out", "x", "--train-size", "10"])
    assert "train_size=10 is too small" in err and "(--train-size) 40 or more" in err
    assert "(--test-size) 20 or more" in usage_error(capsys, fc.parse_args, ["--out", "x", "--test-size", "5"])
    fc.parse_args(["--out", "x", "--train-size", "40", "--test-size", "20"])  # the smallest sizes that stratify
    # split_data (any label set, e.g. chapter 11's four groups) checks against the classes it is given
    labels = np.arange(40) % 4
    texts = [str(i) for i in range(40)]
    with pytest.raises(ValueError, match="train_size=7 is too small.*4 classes.*train_size \\(--train-size\\) 8 or"):
        newsgroups.split_data(texts, labels, texts, labels, list("abcd"), fc.profile_config("quick", train_size=7))
    news = newsgroups.split_data(texts, labels, texts, labels, list("abcd"), fc.profile_config("quick", train_size=8,
                                                                                         test_size=4))
    assert (len(news.train), len(news.val), len(news.test)) == (4, 4, 4)


@pytest.mark.skipif(not NO_GPU, reason="needs a machine without a CUDA GPU")
def test_row4_cuda_without_a_gpu(capsys, monkeypatch):
    err = usage_error(capsys, fc.parse_args, ["--out", "x", "--device", "cuda"])
    assert "torch finds no CUDA GPU" in err and "cpu" in err and "TORCH=" in err
    monkeypatch.setenv("BERTLIB_DEVICE", "cuda")
    with pytest.raises(ValueError, match="BERTLIB_DEVICE='cuda', but torch finds no CUDA GPU"):
        runtime.get_device()
    monkeypatch.setenv("BERTLIB_DEVICE", "gpu")
    with pytest.raises(ValueError, match="not a device: use cpu, cuda or cuda:N"):
        runtime.get_device()


def test_row15_a_profile_named_gets_its_values():
    full = fc.FinetuneConfig(profile="full")
    assert full == fc.profile_config("full") and full.max_length == 512 and full.train_size is None
    assert fc.FinetuneConfig(profile="full", max_length=128).max_length == 128  # a value given wins, even quick's
    assert dataclasses.replace(full, lr=1e-5) == fc.profile_config("full", lr=1e-5)
    assert fc.FinetuneConfig() == fc.profile_config("quick")


def test_row16_none_means_all_posts():
    cfg = fc.profile_config("quick", train_size=None, test_size=None)
    assert (cfg.train_size, cfg.test_size) == (None, None)
    assert fc.profile_config("quick").train_size == fc.FinetuneConfig().train_size  # left out: the profile's
    assert fc.profile_config("quick", seed=None).seed == runtime.default_seed()  # cannot be None: the default


# ---- row 3: the model's length, once the model is known -----------------------------------------------------------


def test_row3_max_length_beyond_the_position_table(tmp_path):
    pt = bertlib.load_pretrained()
    with pytest.raises(ValueError, match=r"--max-length 1024 is longer than .* \(512 tokens.*--max-length 512"):
        bertlib.model.pretrained.check_max_length(1024, pt)
    # train() refuses it right after the model: before the data (a missing archive would fail next) and training
    cfg = fc.profile_config("quick", max_length=1024, device="cpu")
    with pytest.raises(ValueError, match="--max-length 1024"):
        ft.train(cfg, tmp_path / "run", pretrained=pt, verbose=False,
                 cli=ft.CommandLine(archive=tmp_path / "missing.tar.gz"))


# ---- rows 5-8: the benchmark's counts and outputs ------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    (["--repeats", "-1"], "--repeats must be at least 1"),
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--engine-rounds", "0"], "--engine-rounds must be at least 1"),
    (["--engine-posts", "-3"], "--engine-posts must be 0 (all test posts) or a positive count"),
    (["--posts", "-1"], "--posts must be 0 (all test posts)"),
    (["--accuracy-posts", "-2"], "--accuracy-posts must be 0"),
    (["--out", "/missing/dir/x.json"], "the folder /missing/dir does not exist"),
])
def test_rows5_to_8_bench_arguments_before_the_run(capsys, no_loading, argv, words):
    assert words in usage_error(capsys, bench.main, argv)


def test_bench_out_that_is_a_folder(capsys, no_loading, tmp_path):
    assert "is a folder: give a file name" in usage_error(capsys, bench.main, ["--out", str(tmp_path)])
    with pytest.raises(Loaded):  # a good --out passes
        bench.main(["--out", str(tmp_path / "x.json"), "--quick"])


def test_row7_posts_zero_means_all(monkeypatch, no_loading):
    """0 means "all" for --posts as for --engine-posts (it meant "the default"); --help says so."""
    asked = []
    monkeypatch.setattr(bench, "load_pretrained", lambda **kw: bertlib.model.pretrained.Pretrained({}, None, None, "x"))
    monkeypatch.setattr(bench, "random_bert_base", lambda *a: None)
    monkeypatch.setattr(bench, "grid_rows", lambda *a, **kw: [])
    monkeypatch.setattr(bench, "markdown", lambda *a, **kw: "")
    monkeypatch.setattr(bench, "workload_rows", lambda pt, device, n_posts, *a, **kw: asked.append(n_posts) or [])
    skip = ["--no-engines", "--no-finetune", "--no-training", "--quick"]
    for posts, expected in [(["--posts", "0"], None), (["--posts", "5"], 5), ([], 128)]:
        bench.main(skip + posts)
        assert asked.pop() == expected
    help_text = io.StringIO()
    with pytest.raises(SystemExit), monkeypatch.context() as m:
        m.setattr(sys, "stdout", help_text)
        bench.main(["--help"])
    assert help_text.getvalue().count("0: all 7,532") >= 3


def test_row8_finetune_out_that_is_a_file(capsys, tmp_path):
    (tmp_path / "taken").write_text("x")
    assert "is a file, not a folder" in usage_error(capsys, ft.main, ["--out", str(tmp_path / "taken")])


# ---- rows 8-11: fidelity ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, words", [
    pytest.param(["--dtypes", "float32,float16"], "float16 has no stated tolerance on cpu",
                 marks=pytest.mark.skipif(not NO_GPU, reason="float16 is checked on CUDA")),
    (["--dtypes", "foo"], "'foo' is not a torch dtype"),
    (["--dtypes", "Tensor"], "'Tensor' is not a torch dtype"),
    (["--attn", "flash"], "'flash' is not one of bertlib's attention functions"),
    (["--sentences", "0"], "--sentences must be at least 2"),
    (["--json", "/missing/dir/f.json"], "the folder /missing/dir does not exist"),
])
def test_rows8_to_11_fidelity_arguments_before_the_model(capsys, no_loading, monkeypatch, argv, words):
    monkeypatch.setenv("BERTLIB_DEVICE", "cpu")
    assert words in usage_error(capsys, fidelity.main, argv)


# ---- rows 12-14: loading and running ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.int64, torch.int8, torch.bool, "float32"])
def test_row12_load_pretrained_refuses_non_float_dtypes(dtype):
    with pytest.raises(TypeError, match="dtype must be a floating-point torch dtype"):
        bertlib.load_pretrained(dtype=dtype)


@pytest.mark.parametrize("config", [
    RobertaConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37),
    DistilBertConfig(vocab_size=99, dim=32, n_layers=1, n_heads=2, hidden_dim=37),
], ids=["roberta", "distilbert"])
def test_row13_another_architecture_is_refused(tmp_path, config):
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=f"holds a '{config.model_type}' model .*not BERT.*AutoModel"):
        bertlib.load_pretrained(tmp_path)


def test_row14_weights_and_ids_on_different_devices():
    sd, config, _ = random_model(seed=0)
    batch = random_inputs(config, batch=2, seq=5, seed=0)
    elsewhere = {k: v.to("meta") for k, v in sd.items()}  # a second device on any machine
    with pytest.raises(ValueError, match=r"input_ids is on cpu but the weights are on meta.*\.to\('meta'\)"):
        bertlib.bert_forward(elsewhere, config, batch["input_ids"])
    with pytest.raises(ValueError, match="attention_mask is on meta but the weights are on cpu"):
        bertlib.bert_forward(sd, config, batch["input_ids"], batch["attention_mask"].to("meta"))


# ---- the robustness faults --------------------------------------------------------------------------------------


@pytest.fixture
def python_3_11_2(monkeypatch):
    """tarfile as Python 3.11.0-3.11.3 have it: no extraction filters (``filter=`` is a TypeError)."""
    monkeypatch.delattr(tarfile, "data_filter")
    original = tarfile.TarFile.extractall

    def extractall(self, path=".", members=None, *, numeric_owner=False, **kwargs):
        if kwargs:
            raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(kwargs))!r}")
        return original(self, path, members, numeric_owner=numeric_owner, filter="fully_trusted")
    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)


def test_archive_extracts_without_filters(tmp_path, python_3_11_2):
    ok = tar_gz(tmp_path / "ok.tar.gz", {"20news-bydate-train/alt.atheism/1": b"a post",
                                         "20news-bydate-test/alt.atheism/2": b"another"})
    with pytest.raises(ValueError, match="holds 1 train posts, expected 11314"):  # extracted, then counted
        data.build_cache(ok, data_home=tmp_path / "home")
    evil = tar_gz(tmp_path / "evil.tar.gz", {"../evil": b"x"})
    with pytest.raises(ValueError, match="refusing to extract '../evil'"):
        data.build_cache(evil, data_home=tmp_path / "home")
    assert not (tmp_path / "evil").exists()


def test_atomic_write_two_writers_at_once(tmp_path):
    """Two writers of one file (two CI workers filling scikit-learn's cache): each has its own temporary file and
    the file ends whole, one writer's (a fixed temporary name made one writer's replace fail)."""
    target, both_inside, errors, temps = tmp_path / "cache.pkz", threading.Barrier(2), [], []

    def write(payload: bytes):
        try:
            with files.atomic_write(target) as tmp:
                temps.append(tmp)
                tmp.write_bytes(payload)
                both_inside.wait(timeout=10)
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(bytes([i]) * 100_000,)) for i in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(temps)) == 2 and all(t.parent == tmp_path for t in temps)
    assert target.read_bytes() in (b"\1" * 100_000, b"\2" * 100_000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache.pkz"]  # no temporary file left behind


def test_margin_claims_hold_under_python_O():
    code = "from bertlib.course.claims import assert_margin; assert_margin('x: a claim', 0.5, 1.0)"
    done = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "ClaimFailed: x: a claim: observed 0.5, the claim needs > 1" in done.stderr
    assert issubclass(claims.ClaimFailed, AssertionError)


def test_seeds_follow_BERTLIB_SEED(monkeypatch):
    """Every seeded default in bertlib draws with $BERTLIB_SEED, so `make sweep` samples what it changes."""
    from bertlib.course import exercises
    from bertlib.perf import bench_training
    from bertlib.variants import relative_position

    sd, config, _ = random_model(seed=0)

    def draws(seed=None):
        kw = {} if seed is None else {"seed": seed}
        rel = relative_position.add_distance_embeddings(sd, BertConfig(**{**config.to_dict(),
                                                        "position_embedding_type": "relative_key"}), **kw)
        return [bertlib.tasks.classifier.BertClassifier(sd, config, 3, **kw).classifier.weight.detach(),
                exercises.wrong_answer(torch.zeros(4), **kw),
                rel["encoder.layer.0.attention.self.distance_embedding.weight"],
                torch.tensor(list(bench_training.padding_shares(np.arange(1, 200), 8, **kw).values()))]

    monkeypatch.setenv("BERTLIB_SEED", "3")
    for default, three, zero in zip(draws(), draws(3), draws(0), strict=True):
        assert torch.equal(default, three) and not torch.equal(default, zero)


def test_one_profile_registry():
    assert set(fc.PROFILES) == set(runtime.PROFILE_NAMES)
    assert get_args(get_type_hints(fc.FinetuneConfig)["profile"]) == runtime.PROFILE_NAMES
    assert not hasattr(runtime, "PROFILES")  # the names live in runtime, the values in finetune_config.PROFILES


def test_the_book_is_built_from_the_whole_history():
    """Chapter 9b reads earlier results from git history: the workflows that build the book (CI's book is the one
    pages.yml publishes) check out every commit, not GitHub's default single one."""
    import yaml

    for name in ("ci.yml", "gpu.yml"):
        workflow = yaml.safe_load(Path(__file__).resolve().parents[1].joinpath(".github/workflows", name).read_text())
        checkouts = [step for job in workflow["jobs"].values() for step in job["steps"]
                     if step.get("uses", "").startswith("actions/checkout")]
        assert checkouts and all(step.get("with", {}).get("fetch-depth") == 0 for step in checkouts), name


# ---- tooling traps ------------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def make_copy(tmp_path):
    """The Makefile in a scratch folder, with a stand-in .venv whose python and jupyter only log their arguments
    (PYTHON=true: no real venv is made), so a target's pip installs can be counted without installing anything."""
    import shutil

    for name in ("Makefile", "pyproject.toml", "constraints.txt", "package.json", "package-lock.json"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / ".package-lock.json").write_text("{}")
    log = tmp_path / "calls.log"
    for tool in ("python", "jupyter"):
        path = tmp_path / ".venv" / "bin" / tool
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"#!/bin/sh\necho {tool} \"$@\" >> {log}\n")
        path.chmod(0o755)

    def make(*args, env=None):
        import os

        log.write_text("")
        subprocess.run(["make", "-s", "PYTHON=true", *args], cwd=tmp_path, check=True, capture_output=True,
                       env={**os.environ, **(env or {})})
        return log.read_text()
    make.venv = tmp_path / ".venv"
    return make


def test_make_lab_installs_once(make_copy):
    first = make_copy("lab")
    assert "pip install --quiet -c constraints.txt -e .[lab]" in first and "jupyter lab" in first
    second = make_copy("lab")
    assert "pip install" not in second and "jupyter lab" in second


def test_make_book_keeps_the_torch_build_of_make_test(make_copy):
    cuda = "torch --index-url https://download.pytorch.org/whl/cu126"
    make_copy("install")
    assert f"pip install --quiet {cuda}" in make_copy("install", f"TORCH={cuda}")
    assert (make_copy.venv / ".torch-spec").read_text().strip() == cuda
    assert "pip install" not in make_copy("install")  # a plain make (as `make book` runs it) keeps the CUDA build
    assert "uninstall --quiet -y torch" in make_copy("install", env={"TORCH": "torch==2.13.0"})  # asked: CPU again


def test_ci_installs_node_modules_before_the_second_pass():
    """.ci/run's second pass (in the background) runs the chapters, which read node_modules/: npm ci must be done
    before it starts, not rewrite node_modules/ under it during `make book`."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    npm = next(i for i, line in enumerate(lines) if line.startswith("make assets"))
    second = next(i for i, line in enumerate(lines) if "make test-model" in line)
    assert npm < second


@pytest.mark.slow
def test_a_non_editable_install_works(tmp_path):
    """`pip install .` (no -e): every module of bertlib is installed, and the repository's folders (quizzes,
    node_modules, _build) are found from a notebook's folder, as a reader runs chapters/ from a clone."""
    import shutil

    source, target = tmp_path / "source", tmp_path / "site"  # built from a copy: no build/ left in the checkout
    shutil.copytree(ROOT / "bertlib", source / "bertlib", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, timeout=300)
    ours = {p.relative_to(ROOT).as_posix() for p in (ROOT / "bertlib").rglob("*.py")}
    assert ours == {p.relative_to(target).as_posix() for p in (target / "bertlib").rglob("*.py")}
    code = ("import bertlib, bertlib.course.quiz as q, bertlib.perf.bench_engines as b\n"
            "import bertlib.course.bertviz_assets as v\n"
            "print(bertlib.__file__, q.QUIZ_DIR, b.BENCH_DIR, v.node_modules_dir(), sep='\\n')")
    import os

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "BERTLIB_NODE_MODULES")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "chapters", capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(target)}, check=True, timeout=120)
    package, quizzes, bench_dir, node_modules = done.stdout.split()
    assert Path(package).is_relative_to(target)
    assert Path(quizzes) == ROOT / "quizzes" and Path(quizzes, "04.json").is_file()
    assert Path(bench_dir).parent.parent in (ROOT, ROOT / "chapters")
    assert Path(node_modules).parent in (ROOT, ROOT / "chapters")
