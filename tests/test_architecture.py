"""bertlib's shape, as the next engineer needs it: sub-packages by role that form layers (``bertlib.LAYERS``), no
import that points up and no import cycle (function-local imports included), no function that hides a submodule,
every name a chapter reads taken from its one home, and ``import bertlib`` loading only the forward pass.

The import graph is read from the syntax tree of every module, so an import inside a function, which Python runs
late and which hides a cycle from an ordinary import, counts like any other. ``python tests/test_architecture.py``
prints the layers and each module's imports.
"""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import bertlib
from toc import ROOT

PACKAGE = ROOT / "bertlib"

#: What ``import bertlib`` must not load: the forward pass needs torch and transformers' BertConfig and tokenizers,
#: not the data science stack the other layers use (scikit-learn is for 20 Newsgroups and the baselines), and none of
#: bertlib's other sub-packages.
NOT_ON_IMPORT = ("sklearn", "scipy", "pandas", "matplotlib", "IPython", "bertviz", "nbformat")


def layers() -> tuple[str, ...]:
    """The declared layer map, read from ``bertlib/__init__.py`` without importing bertlib."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "LAYERS":
            return tuple(ast.literal_eval(node.value))
    raise AssertionError("bertlib/__init__.py declares no LAYERS")


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module's dotted name → its file (``bertlib`` and ``bertlib.model`` for the ``__init__`` files)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The bertlib modules that module ``name`` imports anywhere in its file: at the top, inside functions, under
    ``if TYPE_CHECKING:``, relative or absolute. ``from p import x`` is module ``p.x`` when there is one, else ``p``."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "bertlib"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            elif (node.module or "").split(".")[0] == "bertlib":
                module = node.module
            else:
                continue
            submodules = {f"{module}.{a.name}" for a in node.names if f"{module}.{a.name}" in known}
            found |= submodules
            if len(submodules) < len(node.names):  # a name defined in the module (or a package's __init__)
                found.add(module)
    return {m for m in found if m in known and m != name}


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    mods = modules(package)
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def layer_of(module: str, order: tuple[str, ...]) -> int:
    """The index of a module's sub-package in the layer map; ``bertlib`` itself belongs to the lowest layer (its
    ``__init__`` offers the forward pass). A sub-package missing from the map is an error, not a free pass."""
    parts = module.split(".")
    if len(parts) == 1:
        return 0
    if parts[1] not in order:
        raise AssertionError(f"{module}: bertlib.{parts[1]} is not in bertlib.LAYERS; add it where it belongs.")
    return order.index(parts[1])


def upward(edges: dict[str, set[str]], order: tuple[str, ...]) -> list[str]:
    """Every import that points to a higher layer, as ``"a -> b (layer x imports layer y)"``."""
    return [f"{a} -> {b} ({order[layer_of(a, order)]} imports {order[layer_of(b, order)]})"
            for a, deps in sorted(edges.items()) for b in sorted(deps) if layer_of(b, order) > layer_of(a, order)]


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None (depth-first search, three colours)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
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


def test_every_sub_package_is_a_layer_and_states_its_place():
    order = layers()
    packages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert packages == set(order), f"sub-packages {sorted(packages)} against LAYERS {order}"
    assert not list(PACKAGE.glob("[!_]*.py")), "every module lives in a sub-package by role"
    for name in order:
        doc = ast.get_docstring(ast.parse((PACKAGE / name / "__init__.py").read_text())) or ""
        assert "layer" in doc.lower() and ":mod:" in doc, f"bertlib/{name}/__init__.py: state its layer and modules"


def test_no_import_points_up():
    bad = upward(graph(), layers())
    assert not bad, ("imports that point to a higher layer (function-local ones count): " + "; ".join(bad)
                     + ". Move what both need into the lower layer, or pass it in.")


def test_the_layer_check_finds_an_upward_import(tmp_path):
    """The test above would pass on a graph that misses imports: here it must flag one that is there, at module level
    and inside a function, and only then."""
    for sub in ("model", "training"):
        (tmp_path / "bertlib" / sub).mkdir(parents=True)
        (tmp_path / "bertlib" / sub / "__init__.py").write_text("")
    (tmp_path / "bertlib" / "__init__.py").write_text("")
    (tmp_path / "bertlib" / "training" / "run.py").write_text("from bertlib.model.encoder import f\n")
    (tmp_path / "bertlib" / "model" / "encoder.py").write_text("def f():\n    from ..training import run\n")
    edges = graph(tmp_path / "bertlib")
    assert edges["bertlib.model.encoder"] == {"bertlib.training.run"}
    assert upward(edges, ("model", "training")) == [
        "bertlib.model.encoder -> bertlib.training.run (model imports training)"]
    (tmp_path / "bertlib" / "model" / "encoder.py").write_text("import torch\n")
    assert upward(graph(tmp_path / "bertlib"), ("model", "training")) == []
    with pytest.raises(AssertionError, match="not in bertlib.LAYERS"):
        upward(graph(tmp_path / "bertlib"), ("model",))


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
    source.write_text("from . import windows as w\nfrom .batches import x\n\ndef f():\n"
                      "    from ..model import encoder\n    import bertlib.training.finetune\n")
    known = {"bertlib", "bertlib.data", "bertlib.data.windows", "bertlib.data.batches", "bertlib.model",
             "bertlib.model.encoder", "bertlib.training.finetune", "bertlib.data.m"}
    assert imports("bertlib.data.m", source, known) == {"bertlib.data.windows", "bertlib.data.batches",
                                                        "bertlib.model.encoder", "bertlib.training.finetune"}
    source.write_text("if TYPE_CHECKING:\n    from bertlib import bert_forward\n")  # a name of the package: __init__
    assert imports("bertlib.data.m", source, known) == {"bertlib"}


def test_no_function_hides_a_submodule():
    """``import bertlib.model.encoder as enc`` must give the module: no package binds another object to the name of
    one of its submodules (bertlib once bound its functions ``encoder``, ``embeddings`` ... over its modules)."""
    for name in [m for m, p in modules().items() if p.name == "__init__.py"]:
        package = importlib.import_module(name)
        for sub in {m.rsplit(".", 1)[1] for m in modules() if "." in m and m.rsplit(".", 1)[0] == name}:
            value = getattr(package, sub, None)
            assert value is None or isinstance(value, types.ModuleType), f"{name}.{sub} is {value!r}, not the module"


def test_every_name_has_one_home():
    """No module re-exports: a module's ``__all__`` lists only what it defines. The one exception is the package
    itself, whose ``__init__`` offers the forward pass's public names (they are defined in ``bertlib.model``)."""
    for name, path in modules().items():
        if name == "bertlib":
            continue
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        exported = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                         and any(getattr(t, "id", None) == "__all__" for t in n.targets)), [])
        assert set(exported) <= defined, f"{name} re-exports {sorted(set(exported) - defined)}"
        assert not any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in tree.body), \
            f"{name}: a module __getattr__ keeps names alive that have a home elsewhere"
    top = importlib.import_module("bertlib")
    assert all(getattr(top, n).__module__.startswith("bertlib.model.") for n in top.__all__
               if not isinstance(getattr(top, n), dict | tuple | str)), "bertlib offers the forward pass only"


def chapter_names() -> dict[str, set[str]]:
    """Dotted ``bertlib`` names each chapter reads (``bertlib.x.y``, ``from bertlib.x import y``, through aliases
    such as ``from bertlib.training import finetune as ft``): name → chapters."""
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
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "bertlib":
                for a in node.names:
                    alias[a.asname or a.name] = f"{node.module}.{a.name}"
                    found.setdefault(f"{node.module}.{a.name}", set()).add(path.stem)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and (name := _dotted(node, alias)):
                found.setdefault(name, set()).add(path.stem)
    return found


def _dotted(node: ast.AST, alias: dict[str, str]) -> str | None:
    """``ft.train`` → ``bertlib.training.finetune.train`` when ``ft`` names a bertlib module; None otherwise."""
    if isinstance(node, ast.Name):
        return alias.get(node.id)
    if isinstance(node, ast.Attribute) and (base := _dotted(node.value, alias)):
        return f"{base}.{node.attr}"
    return None


def test_every_name_a_chapter_reads_exists_at_its_home():
    """Each ``bertlib`` name a chapter uses exists, and is read from the module that defines it (or, for the
    forward pass, from ``bertlib`` itself)."""
    names = chapter_names()
    assert "bertlib.bert_forward" in names and "bertlib.training.finetune.train" in names, "the scan finds nothing"
    missing, elsewhere = [], []
    for name, chapters in sorted(names.items()):
        parts = name.split(".")
        for i in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:i]))
                break
            except ImportError:
                continue
        module = ".".join(parts[:i])
        if i == len(parts):
            continue
        if not hasattr(obj, parts[i]):
            missing.append(f"{name} ({', '.join(sorted(chapters))})")
            continue
        value = getattr(obj, parts[i])
        home = getattr(value, "__module__", None)
        if (isinstance(value, type | types.FunctionType) and home.startswith("bertlib") and home != module
                and module != "bertlib"):
            elsewhere.append(f"{name} is defined in {home} ({', '.join(sorted(chapters))})")
    assert not missing, f"chapters use bertlib names that are gone: {missing}"
    assert not elsewhere, f"chapters read names away from their home: {elsewhere}"


def test_import_bertlib_loads_only_the_forward_pass():
    code = ("import sys, bertlib\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({NOT_ON_IMPORT!r})))\n"
            "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('bertlib.')}))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["[]", "['model']"], out.stdout + out.stderr


def test_each_command_is_installed_and_runs_as_a_module():
    """The five commands of ``[project.scripts]`` name a function that exists, in a module that also runs as
    ``python -m`` (it ends in ``if __name__ == "__main__":``), and the README names each command."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == {"bertlib-finetune", "bertlib-features", "bertlib-bench", "bertlib-fidelity",
                            "bertlib-convert"}
    readme = (ROOT / "README.md").read_text()
    for command, target in scripts.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), target
        assert 'if __name__ == "__main__":' in modules()[module].read_text(), f"python -m {module} does nothing"
        assert command in readme, f"README.md does not name {command}"


#: The most parameters a function may take (``self``/``cls`` not counted; ``*args`` and ``**kwargs`` count one each)
#: and the most lines it may span (from ``def`` to its last line, docstring included, decorators not).
MAX_PARAMETERS, MAX_LINES = 8, 60
#: The one function allowed more parameters: ``bert_forward`` keeps the public keywords the book teaches (they mirror
#: Hugging Face's ``BertModel.forward``); below it one options object carries them. Its length is held to the limit.
MANY_PARAMETERS = {"bertlib.model.encoder.bert_forward"}


def function_sizes(package: Path = PACKAGE) -> list[tuple[str, int, int]]:
    """``(dotted name, parameters, lines)`` of every function and method in the package, nested ones included
    (``bertlib.perf.bench.grid_rows.run``, ``bertlib.model.layer.Layer.forward``)."""
    found = []
    for module, path in modules(package).items():

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                name = f"{prefix}.{child.name}" if hasattr(child, "name") else prefix
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    a = child.args
                    params = [*a.posonlyargs, *a.args, *a.kwonlyargs]
                    count = len(params) + (a.vararg is not None) + (a.kwarg is not None)
                    if params and isinstance(node, ast.ClassDef) and params[0].arg in ("self", "cls"):
                        count -= 1
                    found.append((name, count, child.end_lineno - child.lineno + 1))
                visit(child, name)

        visit(ast.parse(path.read_text(), filename=str(path)), module)
    return found


def oversized(sizes: list[tuple[str, int, int]]) -> list[str]:
    """Each function over :data:`MAX_PARAMETERS` parameters (except :data:`MANY_PARAMETERS`) or :data:`MAX_LINES`
    lines, as ``"name: N parameters"`` / ``"name: N lines"``."""
    bad = [f"{name}: {params} parameters" for name, params, _ in sizes
           if params > MAX_PARAMETERS and name not in MANY_PARAMETERS]
    return bad + [f"{name}: {lines} lines" for name, _, lines in sizes if lines > MAX_LINES]


def test_functions_are_small():
    """No function takes more than 8 parameters (``bert_forward`` aside) or spans more than 60 lines (issue 36): a
    function that needs more takes an options or record dataclass, or is split where its steps are."""
    sizes = function_sizes()
    assert any(name == "bertlib.model.encoder.bert_forward" for name, _, _ in sizes), "the scan finds nothing"
    bad = oversized(sizes)
    assert not bad, ("functions over the limits (8 parameters, 60 lines): " + "; ".join(bad)
                     + ". Group values that travel together in a dataclass; split long functions at their steps.")


def test_the_size_check_finds_a_long_function_and_many_parameters(tmp_path):
    """The test above would pass on a scan that misses functions: here it must flag a method, a nested function and
    a long one that are there, count ``*args``/``**kwargs`` and not ``self``, and pass them at the limits."""
    (tmp_path / "bertlib" / "model").mkdir(parents=True)
    (tmp_path / "bertlib" / "__init__.py").write_text("")
    (tmp_path / "bertlib" / "model" / "__init__.py").write_text("")
    body = "\n".join(f"    x{i} = {i}" for i in range(58))
    (tmp_path / "bertlib" / "model" / "m.py").write_text(
        "class C:\n"
        "    def ok(self, a, b, c, d, e, f, g, h):\n        pass\n"
        "    def many(self, a, b, c, d, e, f, g, *args, **kwargs):\n        pass\n"
        "def outer():\n"
        "    def inner(a, b, c, d, e, f, g, h, i):\n        pass\n"
        "@staticmethod\n"
        f"def fits():\n    \"\"\"doc\"\"\"\n{body}\n"
        f"def too_long():\n    \"\"\"doc\"\"\"\n{body}\n    return x0\n"
        "def bert_forward(a, b, c, d, e, f, g, h, i):\n    pass\n")
    sizes = {name: (params, lines) for name, params, lines in function_sizes(tmp_path / "bertlib")}
    assert sizes["bertlib.model.m.C.ok"] == (8, 2) and sizes["bertlib.model.m.fits"] == (0, 60)
    assert oversized(list(function_sizes(tmp_path / "bertlib"))) == [
        "bertlib.model.m.C.many: 9 parameters", "bertlib.model.m.outer.inner: 9 parameters",
        "bertlib.model.m.bert_forward: 9 parameters", "bertlib.model.m.too_long: 61 lines"]
    assert not [b for b in oversized([("bertlib.model.encoder.bert_forward", 14, 60)])]
    assert oversized([("bertlib.model.encoder.bert_forward", 14, 61)]) == [
        "bertlib.model.encoder.bert_forward: 61 lines"]


if __name__ == "__main__":
    order = layers()
    for name, deps in sorted(graph().items(), key=lambda kv: (layer_of(kv[0], order), kv[0])):
        print(f"[{order[layer_of(name, order)]}] {name} -> {', '.join(sorted(deps))}")


def test_the_readme_tree_is_the_package_tree():
    """README.md's tree names every sub-package (with its layer number) and every module of bertlib (issue 36)."""
    readme = (ROOT / "README.md").read_text()
    tree = readme[readme.index("  bertlib/\n"):]
    tree = tree[:tree.index("```")]
    for layer, package in enumerate(bertlib.LAYERS, start=1):
        assert re.search(rf"── {package}/\s+{layer} ", tree), f"README's tree lacks {package}/ at layer {layer}"
    for path in sorted((ROOT / "bertlib").rglob("*.py")):
        if path.stem != "__init__":
            assert re.search(rf"\b{path.stem}\b", tree), f"README's tree does not name {path.relative_to(ROOT)}"
