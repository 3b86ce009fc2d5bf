"""The GitHub Actions workflows in .github/workflows/, checked for what they run: valid against GitHub's workflow
schema (check-jsonschema's bundled copy, so offline); every `make` target, script and action they name exists (and
every command of .ci/run too); ci.yml runs the repository's own CI script, whose `make test` is the README's test
command; pages.yml publishes the book that CI built, executing nothing again; no self-hosted runner takes pull
requests; every workflow limits its token."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import pytest
import yaml

from toc import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))
MAKEFILE = (ROOT / "Makefile").read_text()
CI_SCRIPT = (ROOT / ".ci" / "run").read_text()


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def triggers(workflow: dict) -> dict:
    """The `on:` block (YAML 1.1, as PyYAML reads it, turns the key `on` into True)."""
    on = workflow.get("on", workflow.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return on or {}


def steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def uses(workflow: dict, action: str) -> list[dict]:
    """The steps that run ``action`` (any version)."""
    return [s for s in steps(workflow) if s.get("uses", "").split("@")[0] == action]


def runs(workflow: dict) -> str:
    """Every shell line the workflow runs, joined."""
    return "\n".join(s.get("run", "") for s in steps(workflow))


def make_targets(text: str) -> list[str]:
    return re.findall(r"(?<![\w-])make\s+([a-z][\w-]*)", text)


def recipe(target: str) -> str:
    """The Makefile recipe of ``target`` (its tab-indented lines), with the Makefile's simple variables expanded."""
    match = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", MAKEFILE, re.MULTILINE)
    assert match, f"no `make {target}` recipe"
    text = match.group(1)
    variables = dict(re.findall(r"^([A-Z_]+)\s*[:?]?=\s*([^#\n]*?)\s*(?:#.*)?$", MAKEFILE, re.MULTILINE))
    for _ in range(3):
        text = re.sub(r"\$\((\w+)\)", lambda m: variables.get(m.group(1), m.group(0)), text)
    return text


def test_workflows_are_valid_against_githubs_schema():
    pytest.importorskip("check_jsonschema", reason="pip install check-jsonschema (the `test` extra)")
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "pages.yml", "gpu.yml"}
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                             *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_what_a_workflow_names_exists_and_actions_are_pinned(path):
    workflow = yaml.safe_load(path.read_text())
    for step in steps(workflow):
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[\w.-]+", step["uses"]), f"{path.name}: unpinned {step['uses']}"
        for target in make_targets(step.get("run", "")):
            assert re.search(rf"^{re.escape(target)}:", MAKEFILE, re.MULTILINE), f"{path.name}: no `make {target}`"
        for script in re.findall(r"\bbash\s+(\S+)", step.get("run", "")):
            assert (ROOT / script).is_file(), f"{path.name}: {script} does not exist"


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_every_workflow_limits_its_token_and_no_self_hosted_runner_takes_pull_requests(path):
    workflow = yaml.safe_load(path.read_text())
    assert workflow.get("permissions", {}).get("contents") == "read", f"{path.name}: set permissions: contents: read"
    self_hosted = [name for name, job in workflow["jobs"].items() if "self-hosted" in str(job.get("runs-on"))]
    if self_hosted:
        pulls = {"pull_request", "pull_request_target"} & set(triggers(workflow))
        assert not pulls, f"{path.name}: {pulls} would run a pull request's code on the self-hosted {self_hosted}"
        assert "concurrency" in workflow, f"{path.name}: one run at a time on the self-hosted runner"


def test_ci_runs_the_ci_script_whose_make_test_is_the_readmes_test_command():
    ci = load("ci.yml")
    assert {"push", "pull_request"} <= set(triggers(ci))
    assert [s.get("run", "").strip() for s in steps(ci)].count("bash .ci/run") == 1, "ci.yml must run `bash .ci/run`"
    # what .ci/run runs: each make target exists, and the order is the one the README describes
    ran = [m.group(1) for line in CI_SCRIPT.splitlines() if (m := re.match(r"\s*make\s+([a-z][\w-]*)", line))]
    order = iter(ran)  # the steps the README describes, in this order (other steps may come between them)
    assert all(step in order for step in ("install", "lint", "test", "book", "browser-test")), ran
    for target in ran:
        assert re.search(rf"^{re.escape(target)}:", MAKEFILE, re.MULTILINE), f".ci/run: no `make {target}`"
    # make test = unit tests + nbval over the toc's notebooks, the command the README gives for running it by hand
    test_cmd = " ".join(recipe("test").split()).replace("$(PY) -m ", "").replace(".venv/bin/python -m ", "")
    readme = (ROOT / "README.md").read_text()
    by_hand = next(line.strip() for line in readme.splitlines() if line.strip().startswith("pytest tests $("))
    test_cmd = test_cmd[test_cmd.index("pytest "):]  # the command, without the thread setting make puts before it
    norm = lambda cmd: shlex.split(re.sub(r"\$\$?\(.*?toc\.py\)", "TOC", cmd))  # noqa: E731

    assert norm(test_cmd)[:-1] == norm(by_hand), (test_cmd, by_hand)  # make adds --durations
    (job,) = ci["jobs"].values()
    assert "download.pytorch.org/whl/cpu" in job["env"]["TORCH"], "PyPI's Linux torch is the CUDA build"
    # scikit-learn's cache is where .ci/run points SCIKIT_LEARN_DATA
    assert f'SCIKIT_LEARN_DATA="$PWD/{job["env"]["SKLEARN_DATA"]}"' in CI_SCRIPT
    assert [s["with"]["path"] for s in uses(ci, "actions/cache/restore")] == ["${{ env.SKLEARN_DATA }}"]
    uploaded = {s["with"]["name"]: s for s in uses(ci, "actions/upload-artifact")}
    assert "_build/html" in uploaded["book-html"]["with"]["path"].split(), "the book `make book` writes"
    assert "_build/html" in recipe("book")
    assert uploaded["screenshots"]["if"] == "always()"


def test_ci_script_falls_back_to_sklearns_download_without_shared(tmp_path):
    """.ci/run's archive line, run in a clone with no ../shared beside it: BERTLIB_20NG_ARCHIVE ends up empty
    (scikit-learn downloads); with the archive there, it points at it; a value already set is kept."""
    lines = [line for line in CI_SCRIPT.splitlines()
             if "shared_archive" in line or line.startswith("export BERTLIB_20NG_ARCHIVE")]
    clone = tmp_path / "clone"
    clone.mkdir()
    script = "set -euo pipefail\n" + "\n".join(lines) + '\nprintf %s "$BERTLIB_20NG_ARCHIVE"\n'

    def archive(env_value: str | None = None) -> str:
        env = {"PATH": "/usr/bin:/bin"} | ({} if env_value is None else {"BERTLIB_20NG_ARCHIVE": env_value})
        return subprocess.run(["bash", "-c", script], cwd=clone, env=env, capture_output=True, text=True,
                              check=True).stdout

    assert archive() == ""
    assert archive("/elsewhere/20news-bydate.tar.gz") == "/elsewhere/20news-bydate.tar.gz"
    shared = tmp_path / "shared" / "data" / "20news-bydate.tar.gz"
    shared.parent.mkdir(parents=True)
    shared.touch()
    assert archive() == str(shared)
    assert archive("/elsewhere/20news-bydate.tar.gz") == "/elsewhere/20news-bydate.tar.gz"


def test_pages_publishes_the_book_ci_built_without_executing_it_again():
    pages, ci = load("pages.yml"), load("ci.yml")
    run_on = triggers(pages)["workflow_run"]
    assert run_on["workflows"] == [ci["name"]] and run_on["types"] == ["completed"] and run_on["branches"] == ["main"]
    assert "success" in pages["jobs"]["build"]["if"] and "'push'" in pages["jobs"]["build"]["if"]
    # nothing is installed, executed or built here
    commands = runs(pages)
    assert not make_targets(commands) and not re.search(r"\b(pytest|jupyter-book|pip|nbval)\b", commands), commands
    (download,) = uses(pages, "actions/download-artifact")
    uploaded = {s["with"]["name"]: s["with"]["path"].split() for s in uses(ci, "actions/upload-artifact")}
    assert download["with"]["name"] in uploaded, "pages downloads an artifact ci.yml does not upload"
    # upload-artifact keeps paths below their common folder (_build), so the download goes back to _build
    assert download["with"]["path"] == "_build" and "_build/html" in uploaded[download["with"]["name"]]
    (artifact,) = uses(pages, "actions/upload-pages-artifact")
    assert artifact["with"]["path"] == "_build/html"
    assert pages["permissions"]["actions"] == "read" and pages["permissions"]["pages"] == "write"
    deploy = pages["jobs"]["deploy"]
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]


def test_gpu_runs_the_gpu_script_by_hand_and_weekly():
    gpu = load("gpu.yml")
    assert set(triggers(gpu)) == {"workflow_dispatch", "schedule"}
    assert "bash .ci/gpu" in runs(gpu) and (ROOT / ".ci" / "gpu").is_file()
