"""The package's layers point one way: every import of minivlm/ (deferred ones inside functions included) read from
the source, then checked for circles between files and between packages, and for the rules docs/ENGINE.md states."""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "minivlm")
UI = ("gradio", "plotly", "pandas")


def module_name(path: str) -> str:
    rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
    return rel[: -len(".__init__")] if rel.endswith(".__init__") else rel


def sources() -> dict[str, str]:
    found = {}
    for folder, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                found[module_name(os.path.join(folder, f))] = os.path.join(folder, f)
    return found


def imports(path: str, name: str, known: set[str]) -> set[str]:
    """Every minivlm module this file imports, anywhere in it (a `from pkg import mod` names the module)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return {m for m in out if m in known}


def graph() -> dict[str, set[str]]:
    src = sources()
    return {name: imports(path, name, set(src)) - {name} for name, path in src.items()}


def unit(module: str) -> str:
    """A file's package for the package graph: minivlm/<pkg>/..., or the top-level file itself."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one node (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(g):
        if v not in index:
            visit(v)
    return found


def package_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    pg: dict[str, set[str]] = {}
    for a, targets in g.items():
        if a == "minivlm":  # the package's front door re-exports every layer: it is above them all
            continue
        pg.setdefault(unit(a), set()).update(unit(b) for b in targets if unit(b) != unit(a) and b != "minivlm")
    return pg


def test_no_circle_between_files():
    g = {a: {b for b in targets if b != "minivlm"} for a, targets in graph().items()}
    assert cycles(g) == []


def test_no_circle_between_packages():
    assert cycles(package_graph(graph())) == []


def test_the_engine_never_imports_views_or_kernels():
    g = graph()
    bad = {a: sorted(b for b in t if b.startswith("minivlm.views") or
                     (b.startswith("minivlm.model.backends.") and b.count(".") > 3))
           for a, t in g.items() if a.startswith("minivlm.engine")}
    assert {a: b for a, b in bad.items() if b} == {}


def test_no_ui_library_in_the_engine():
    for name, path in sources().items():
        tree = ast.parse(open(path, encoding="utf-8").read())
        names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names} | \
            {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not names & set(UI), name


def test_the_checker_sees_a_circle():
    """The checker itself: a made-up circle, a deferred one and a package-level one are found."""
    g = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert cycles(g) == [["a", "b", "c"]]
    pg = package_graph({"minivlm.x.f": {"minivlm.y.g"}, "minivlm.y.g": set(), "minivlm.y.h": {"minivlm.x.k"},
                        "minivlm.x.k": set()})
    assert cycles(pg) == [["minivlm.x", "minivlm.y"]]


@pytest.mark.parametrize("mod", ["minivlm.inputs", "minivlm.engine", "minivlm.model"])
def test_layer_packages_exist(mod):
    assert os.path.isdir(os.path.join(os.path.dirname(ROOT), *mod.split(".")))
