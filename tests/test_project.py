"""The project's own consistency: dependencies declared twice agree, the book's notebooks are all listed,
stored without outputs, and each proves its claims with assertions that can fail: read from the notebooks' syntax
trees, and shown by running chapter 3 with ``bertlib.layer_norm`` off by 1e-3, which must stop it."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
import yaml

from helpers import SUBPROCESS_TIMEOUT, needs_data
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


#: Pinned in constraints.txt besides the recorded versions: the subsets' sampler, the book's builder, the linter.
TOOL_PINS = ("scikit-learn", "Sphinx", "jupyter-book", "ruff")


def test_constraints_pin_the_recorded_versions():
    """constraints.txt (what `make install` installs with) pins the versions tests/reproducibility.json recorded the
    golden numbers with; torch is chosen by the Makefile's TORCH, whose default is the recorded version."""
    recorded = json.loads((ROOT / "tests" / "reproducibility.json").read_text())["recorded_with"]
    pins = dict(line.split("==") for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    tools = {k: pins.pop(k, None) for k in TOOL_PINS}
    assert pins == {k: v for k, v in recorded.items() if k not in ("python", "torch")}, (pins, recorded)
    assert all(tools.values()), f"constraints.txt must pin {TOOL_PINS}: {tools}"
    torch_default = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert torch_default and recorded["torch"].split("+")[0] == torch_default.group(1)
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert python.startswith(">=3.11"), "the tests read pyproject.toml with tomllib (Python 3.11)"


def _imported_modules(paths) -> set[str]:
    """Top-level names of the modules ``paths`` import (at any depth), standard library and local ones left out."""
    local = {"bertlib", "bertbook", "tests", *(p.stem for p in (ROOT / "tests").glob("*.py"))}
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - local


def test_the_test_extra_provides_what_the_tests_import():
    """Every third-party module tests/ imports (the browser tests aside: the `browser` extra) comes from a package
    that pyproject.toml declares: a dependency, or the `book` or `test` extra that `make install` installs."""
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    for extra in ("book", "test"):
        declared |= {_name(r) for r in project["optional-dependencies"][extra]}
    providers = packages_distributions()
    missing = {}
    for module in _imported_modules((ROOT / "tests").glob("*.py")):
        dists = {_name(d) for d in providers.get(module, [])}
        if not dists & declared:
            missing[module] = sorted(dists) or "not installed"
    assert not missing, f"tests import modules no declared package provides: {missing}"


def test_make_help_lists_every_target():
    makefile = (ROOT / "Makefile").read_text()
    declarations = re.findall(r"^\.PHONY:((?:[^\n]*\\\n)*[^\n]*)", makefile, re.MULTILINE)
    phony = set(" ".join(declarations).replace("\\", " ").split())
    documented = set(re.findall(r"^## make ([a-z][\w-]*)", makefile, re.MULTILINE))
    assert phony - {"FORCE"} <= documented, f"targets without a `## make <target>: ...` line: {phony - documented}"
    out = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True, check=True)
    listed = {line.split()[0] for line in out.stdout.splitlines()[1:] if line.strip()}
    assert listed == documented, (listed, documented)


def test_every_toc_entry_exists_and_every_chapter_is_listed():
    listed = toc_files()
    for f in listed:
        assert any((ROOT / f"{f}{ext}").exists() for ext in (".ipynb", ".md")), \
            f"_toc.yml lists {f}, which does not exist"
    on_disk = {str(p.relative_to(ROOT).with_suffix("")) for p in (ROOT / "chapters").glob("*.ipynb")}
    assert on_disk <= set(listed), f"notebooks missing from _toc.yml: {sorted(on_disk - set(listed))}"


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.name)
def test_notebook_is_clean_and_asserts(path: Path):
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code), \
        f"{path.name} has stored outputs: clear them (the build and nbval execute the notebook)"
    source = "\n".join("".join(c["source"]) for c in code)
    assert "bertlib.course.setup(" in source, "every chapter starts with bertlib.course.setup() (device, profile, seed)"
    assert nb["metadata"].get("kernelspec", {}).get("name") == "python3"


def _code_tree(path: Path) -> ast.Module:
    """All code cells of a notebook as one syntax tree (IPython ``%magic`` and ``!shell`` lines left out)."""
    cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    lines = [line for cell in cells for line in cell.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return ast.parse("\n".join(lines), filename=str(path))


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _called(call: ast.Call, *names: str) -> bool:
    """Whether ``call`` calls a function whose dotted name ends with one of ``names``."""
    return any(ast.unparse(call.func).split(".")[-1] == n for n in names)


def _tolerance_names(tree: ast.Module) -> set[str]:
    """Names bound to ``bertlib.tolerance(...)``, alone or in a tuple assignment."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            both_tuples = isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
            pairs = zip(target.elts, value.elts, strict=False) if both_tuples else [(target, value)]
            found |= {t.id for t, v in pairs if isinstance(t, ast.Name) and isinstance(v, ast.Call)
                      and ast.unparse(v.func) == "bertlib.tolerance"}
    return found


def _is_real_assert_close(call: ast.Call, tol_names: set[str]) -> bool:
    """``assert_close(a, b, ...)`` with ``a`` and ``b`` different expressions and a tolerance that is explicit
    (``atol=`` and ``rtol=``), ``**bertlib.tolerance(...)`` or ``**`` of a name bound to it."""
    if not _called(call, "assert_close") or len(call.args) < 2 or _same(call.args[0], call.args[1]):
        return False
    keywords = {k.arg for k in call.keywords}
    spread = [k.value for k in call.keywords if k.arg is None]
    from_book = any(isinstance(n, ast.Name) and n.id in tol_names or isinstance(n, ast.Call)
                    and ast.unparse(n.func) == "bertlib.tolerance" for v in spread for n in ast.walk(v))
    return {"atol", "rtol"} <= keywords or from_book


def _number(node: ast.AST) -> float | None:
    value = node.value if isinstance(node, ast.Constant) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def trivial_checks(tree: ast.Module) -> list[str]:
    """Checks that cannot fail: ``assert <constant>``, ``assert 0 <= x <= 1`` (the range of any fraction), a
    comparison of an expression with itself, ``assert_close``/``torch.equal``/``allclose`` of a value with itself."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            t = node.test
            if isinstance(t, ast.Constant) and t.value:
                found.append(ast.unparse(node))
            elif isinstance(t, ast.Compare):
                operands = [t.left, *t.comparators]
                if any(_same(a, b) for a, b in zip(operands, operands[1:], strict=False)):
                    found.append(ast.unparse(node))
                elif (len(operands) == 3 and all(isinstance(op, ast.LtE | ast.Lt) for op in t.ops)
                      and _number(operands[0]) is not None and _number(operands[2]) is not None
                      and _number(operands[0]) <= 0 and _number(operands[2]) >= 1):
                    found.append(ast.unparse(node))
        elif (isinstance(node, ast.Call) and _called(node, "assert_close", "equal", "allclose", "array_equal")
              and len(node.args) >= 2 and _same(node.args[0], node.args[1])):
            found.append(ast.unparse(node))
    return found


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: p.name)
def test_notebook_asserts_what_can_fail(path: Path):
    tree = _code_tree(path)
    tol_names = _tolerance_names(tree)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    if path.parent.name == "chapters":
        assert any(_is_real_assert_close(c, tol_names) for c in calls), \
            f"{path.name}: no torch.testing.assert_close(a, b) of two different values with the book's tolerance"
    assert trivial_checks(tree) == [], f"{path.name}: checks that cannot fail"


def test_the_notebook_checks_recognise_what_cannot_fail():
    """The rules above on small examples, so that a rule that accepted everything would fail here."""
    good = ast.parse("tol = bertlib.tolerance(d)\nassert_close(a, b, **tol)\nassert 0.2 < acc <= 1")
    assert trivial_checks(good) == [] and _is_real_assert_close(good.body[1].value, _tolerance_names(good))
    for source in ["assert True", "assert 0 <= acc <= 1.0", "assert x.mean() == x.mean()",
                   "torch.testing.assert_close(y, y, atol=0, rtol=0)", "assert torch.equal(f(x), f(x))"]:
        assert trivial_checks(ast.parse(source)) in ([source], [source.removeprefix("assert ")]), source
    for source in ["assert_close(y, y, **tol)", "assert_close(a, b)", "assert_close(a, b, **other)",
                   "assert_close(a, b, atol=1)"]:
        tree = ast.parse("tol = bertlib.tolerance(d)\n" + source)
        assert not _is_real_assert_close(tree.body[1].value, _tolerance_names(tree)), source


#: Started in the kernel through ``sitecustomize``: ``bertlib.layer_norm`` returns its result plus 1e-3.
_PERTURB = """
import functools
import bertlib
_exact = bertlib.layer_norm
bertlib.layer_norm = functools.wraps(_exact)(lambda *args, **kwargs: _exact(*args, **kwargs) + 1e-3)
"""

#: Executes the notebook in argv[1] with nbclient and prints, as JSON, the error of the first failing cell.
_EXECUTE = """
import json, sys
import nbclient, nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
try:
    nbclient.NotebookClient(nb, kernel_name="python3", timeout=None,
                            resources={"metadata": {"path": sys.argv[2]}}).execute()
except nbclient.exceptions.CellExecutionError:
    pass
failed = [(c.source, o) for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
          if o.output_type == "error"]
print(json.dumps({"source": failed[0][0], "ename": failed[0][1].ename, "evalue": failed[0][1].evalue}
                 if failed else None))
"""


@pytest.mark.slow
@pytest.mark.data
@needs_data
def test_chapter_3_fails_when_layer_norm_is_off_by_1e_3(tmp_path):
    """Mutation test: the cheapest chapter that checks a bertlib function against HF, run with that function
    perturbed far below anything a reader would see (1e-3) but 50 times the float32 tolerance. It must stop at an
    assert_close of bertlib.layer_norm. (Unperturbed, nbval runs it in the notebook tests.)"""
    (tmp_path / "sitecustomize.py").write_text(_PERTURB)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]), OMP_NUM_THREADS="1", CI="1")
    chapter = ROOT / "chapters" / "03_layer_norm.ipynb"
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_EXECUTE), str(chapter), str(chapter.parent)],
                          env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    failure = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failure is not None, "chapter 3 ran to the end with bertlib.layer_norm off by 1e-3"
    assert failure["ename"] == "AssertionError" and "Tensor-likes are not close" in failure["evalue"], failure
    assert "bertlib.layer_norm(" in failure["source"], failure
