"""bertlib's shape, as the next engineer needs it: no import cycle (function-local imports included), no module
that grew past the size one reads in a sitting, and ``import bertlib`` pulls in only what the forward pass needs.

The import graph is read from the syntax tree of every module, so an import inside a function, which Python runs
late and which hides a cycle from an ordinary import, counts like any other. ``python tests/test_architecture.py``
prints the graph and the module sizes.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from toc import ROOT

PACKAGE = ROOT / "bertlib"

#: Lines a module may have. Modules above it are listed in LONG with the reason they stay whole.
MAX_LINES = 400
LONG: dict[str, str] = {
    # issue 36 replaces this rule by the layer map; until that split, the commands' argument checks (issue 36,
    # section 3) sit next to the code they guard
    "bertlib.bench": "main's argument checks (check_args) beside the sections they guard",
    "bertlib.finetune": "the model-length check in _setup, between loading the model and reading the data",
}

#: What ``import bertlib`` must not load: the forward pass needs torch and transformers' BertConfig and tokenizers,
#: not the data science stack the application modules use (scikit-learn is for 20 Newsgroups and the baselines).
NOT_ON_IMPORT = ("sklearn", "scipy", "pandas", "matplotlib", "IPython", "bertviz", "nbformat")


def modules() -> dict[str, Path]:
    """``bertlib.x`` → its file, and ``bertlib`` → ``__init__.py``."""
    found = {"bertlib": PACKAGE / "__init__.py"}
    found |= {f"bertlib.{p.stem}": p for p in sorted(PACKAGE.glob("*.py")) if p.stem != "__init__"}
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The bertlib modules that ``name`` imports anywhere in its file: at the top, inside functions, under
    ``if TYPE_CHECKING:``, relative or absolute. ``from . import x`` is module ``bertlib.x`` when there is one,
    else the package itself."""
    package = "bertlib"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == package}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package if node.level == 1 else None  # bertlib has no sub-packages
                assert base is not None, f"{path}: import beyond the package"
                module = f"{base}.{node.module}" if node.module else base
            elif (node.module or "").split(".")[0] == package:
                module = node.module
            else:
                continue
            submodules = {f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known}
            found |= submodules
            if len(submodules) < len(node.names):  # a name defined in the module (or the package's __init__)
                found.add(module)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_no_import_cycle():
    cycle = find_cycle(graph())
    assert cycle is None, ("import cycle (function-local imports count): " + " -> ".join(cycle)
                           + ". Move what both need into a lower module, or pass it in.")


def test_the_cycle_finder_finds_cycles():
    """The test above would pass on an empty graph: here it must find a cycle that is there, and only then."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_graph_reads_local_and_relative_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("from . import data as data\nfrom .encoder import x\n\ndef f():\n    from .windows import y\n"
                      "    import bertlib.finetune\n")
    known = {"bertlib", "bertlib.data", "bertlib.encoder", "bertlib.windows", "bertlib.finetune", "bertlib.m"}
    assert imports("bertlib.m", source, known) == {"bertlib.data", "bertlib.encoder", "bertlib.windows",
                                                  "bertlib.finetune"}
    source.write_text("if TYPE_CHECKING:\n    from bertlib import setup\n")  # a name of the package: its __init__
    assert imports("bertlib.m", source, known) == {"bertlib"}


def sizes() -> dict[str, int]:
    return {name: len(path.read_text().splitlines()) for name, path in modules().items()}


def test_no_module_outgrows_a_reading():
    long = {name: n for name, n in sizes().items() if n > MAX_LINES and name not in LONG}
    assert not long, (f"modules over {MAX_LINES} lines: {long}. Split them by concern (re-import the public names "
                      "where chapters use them), or list one in LONG with the reason it stays whole.")


def test_import_bertlib_loads_only_what_the_forward_pass_needs():
    code = ("import sys, bertlib\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({NOT_ON_IMPORT!r})))\n"
            "bertlib.data.pad_batch([[1, 2]], 0)\n"   # the data module is there, and works without them
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({NOT_ON_IMPORT!r})))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "[]"], out.stdout + out.stderr


if __name__ == "__main__":
    for name, deps in sorted(graph().items()):
        print(f"{name} ({sizes()[name]} lines) -> {', '.join(sorted(d.removeprefix('bertlib.') for d in deps))}")
