"""The project's own consistency: dependencies declared twice agree, the book's notebooks are all listed,
stored without outputs, and each proves its claims with assertions."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

from toc import ROOT, notebooks, toc_files


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    for extra in ("book", "test"):
        declared |= {_name(r) for r in project["optional-dependencies"][extra]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    in_env = {_name(r) for r in pip if not r.startswith("-e")}
    assert in_env == declared, f"only in environment.yml: {in_env - declared}; only in pyproject: {declared - in_env}"


def test_every_toc_entry_exists_and_every_chapter_is_listed():
    listed = toc_files()
    for f in listed:
        assert any((ROOT / f"{f}{ext}").exists() for ext in (".ipynb", ".md")), f"_toc.yml lists {f}, which does not exist"
    on_disk = {str(p.relative_to(ROOT).with_suffix("")) for p in (ROOT / "chapters").glob("*.ipynb")}
    assert on_disk <= set(listed), f"notebooks missing from _toc.yml: {sorted(on_disk - set(listed))}"


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.name)
def test_notebook_is_clean_and_asserts(path: Path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), \
        f"{path.name} has stored outputs: clear them (the build and nbval execute the notebook)"
    source = "\n".join("".join(c["source"]) for c in code)
    assert "bertlib.setup(" in source, "every chapter starts with bertlib.setup() (device, profile, seed)"
    assert "assert_close" in source, "every chapter proves its claims with torch.testing.assert_close"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"
