"""The GitHub Actions workflows in .github/workflows/: valid against GitHub's workflow schema (check-jsonschema's
bundled copy, so offline), and doing what the README says: ci.yml runs `bash .ci/run` on pushes and pull requests,
pages.yml builds the book and deploys _build/html."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from toc import ROOT

WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.y*ml"))


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


def test_workflows_are_valid_against_githubs_schema():
    pytest.importorskip("check_jsonschema", reason="pip install check-jsonschema (the `test` extra)")
    assert {p.name for p in WORKFLOWS} >= {"ci.yml", "pages.yml", "gpu.yml"}
    result = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                             *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_actions_are_pinned_and_make_targets_exist(path):
    workflow = yaml.safe_load(path.read_text())
    makefile = (ROOT / "Makefile").read_text()
    for step in steps(workflow):
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@[\w.-]+", step["uses"]), f"{path.name}: unpinned {step['uses']}"
        for target in re.findall(r"\bmake\s+([\w-]+)", step.get("run", "")):
            assert re.search(rf"^{re.escape(target)}:", makefile, re.MULTILINE), f"{path.name}: no `make {target}`"
        for script in re.findall(r"\bbash\s+(\S+)", step.get("run", "")):
            assert (ROOT / script).is_file(), f"{path.name}: {script} does not exist"


def test_ci_runs_the_ci_script_on_pushes_and_pull_requests():
    ci = load("ci.yml")
    assert {"push", "pull_request"} <= set(triggers(ci))
    assert any(s.get("run", "").strip() == "bash .ci/run" for s in steps(ci)), "ci.yml must run `bash .ci/run`"
    assert ci["concurrency"]["cancel-in-progress"] is True
    (job,) = ci["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest" and job["timeout-minutes"] <= 90
    assert "download.pytorch.org/whl/cpu" in job["env"]["TORCH"], "PyPI's Linux torch is the CUDA build"
    python = uses(ci, "actions/setup-python")[0]["with"]
    assert python["cache"] == "pip" and python["cache-dependency-path"] == "pyproject.toml"
    node = uses(ci, "actions/setup-node")[0]["with"]
    assert node["cache"] == "npm" and node["cache-dependency-path"] == "package-lock.json"
    # scikit-learn's cache is where .ci/run points SCIKIT_LEARN_DATA
    run_script = (ROOT / ".ci" / "run").read_text()
    data_dir = job["env"]["SKLEARN_DATA"]
    assert f'SCIKIT_LEARN_DATA="$PWD/{data_dir}"' in run_script
    assert [s["with"]["path"] for s in uses(ci, "actions/cache/restore")] == ["${{ env.SKLEARN_DATA }}"]
    uploaded = {s["with"]["name"]: s for s in uses(ci, "actions/upload-artifact")}
    assert "_build/html" in uploaded["book-html"]["with"]["path"].split()
    assert uploaded["screenshots"]["with"]["path"] == "_build/screenshots"
    assert uploaded["screenshots"]["if"] == "always()"


def test_ci_script_falls_back_to_sklearns_download_without_shared(tmp_path):
    """.ci/run's archive line, run in a clone with no ../shared beside it: BERTLIB_20NG_ARCHIVE ends up empty
    (scikit-learn downloads); with the archive there, it points at it; a value already set is kept."""
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
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


def test_pages_builds_and_deploys_the_book():
    pages = load("pages.yml")
    assert triggers(pages)["push"]["branches"] == ["main"] and "workflow_dispatch" in triggers(pages)
    assert pages["permissions"]["pages"] == "write" and pages["permissions"]["id-token"] == "write"
    runs = [s.get("run", "").strip() for s in steps(pages)]
    assert "make install" in runs and "make book" in runs
    assert pages["jobs"]["build"]["env"]["BERTLIB_PROFILE"] == "quick"
    assert uses(pages, "actions/configure-pages")
    (artifact,) = uses(pages, "actions/upload-pages-artifact")
    assert artifact["with"]["path"] == "_build/html"
    deploy = pages["jobs"]["deploy"]
    assert deploy["needs"] == "build" and deploy["environment"]["name"] == "github-pages"
    assert [s["uses"].split("@")[0] for s in deploy["steps"]] == ["actions/deploy-pages"]
