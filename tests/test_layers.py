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


# ---- no reaching into another package's private attributes (#53) ----
HERE = os.path.dirname(ROOT)
# names private to the libraries minivlm builds on that it may touch: transformers' own idioms for building a vision
# tower from a config (torch's private API, torch._dynamo and torch.ops.<lib>._op, is allowed by its root `torch`)
LIBRARY_PRIVATE = {"_attn_implementation", "_from_config", "_merge_kwargs"}


def python_files(*roots: str) -> list[str]:
    out = []
    for root in roots:
        path = os.path.join(HERE, root)
        out += [path] if path.endswith(".py") else [os.path.join(d, f) for d, _, fs in os.walk(path)
                                                   for f in fs if f.endswith(".py")]
    return sorted(out)


def owner(path: str) -> str:
    """The package a file belongs to for this rule: minivlm/<pkg> (subpackages included), panels, or the file."""
    parts = os.path.relpath(path, HERE)[:-3].split(os.sep)
    return ".".join(parts[:2]) if parts[0] == "minivlm" and len(parts) > 1 else parts[0]


def defined_private(tree: ast.AST) -> set[str]:
    """The private names a file defines: its functions and classes, and the attributes it assigns (self._x = ...)."""
    names = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
    return {n for n in names if n.startswith("_")}


def private_reads(tree: ast.AST) -> list[tuple[int, str, str]]:
    """(line, expression, name) of every obj._name whose obj is not self or cls (dunders and torch's own aside)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr.startswith("_") and not n.attr.endswith("__"):
            root = n.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")) and \
                    not (isinstance(root, ast.Name) and root.id == "torch") and n.attr not in LIBRARY_PRIVATE:
                out.append((n.lineno, ast.unparse(n), n.attr))
    return out


def reaches(sources: dict[str, str]) -> list[str]:
    """'path:line expression' for each private attribute read where no file of the reader's package defines it."""
    trees = {p: ast.parse(src) for p, src in sources.items()}
    defined: dict[str, set[str]] = {}
    for p, tree in trees.items():
        defined.setdefault(owner(p), set()).update(defined_private(tree))
    return [f"{os.path.relpath(p, HERE)}:{line} {expr}" for p, tree in trees.items()
            for line, expr, name in private_reads(tree) if name not in defined[owner(p)]]


def test_no_module_reaches_into_another_packages_private_attributes():
    """obj._name is read only inside the package that defines _name: across packages a module uses public names
    (the engine's are docs/API.md). The app and its panels included."""
    files = python_files("minivlm", "panels", "app.py")
    assert reaches({p: open(p, encoding="utf-8").read() for p in files}) == []


def test_the_private_access_checker_sees_a_reach():
    a, b = os.path.join(HERE, "minivlm", "x", "a.py"), os.path.join(HERE, "panels", "b.py")
    src = {a: "class C:\n    def __init__(self):\n        self._n = 1\n\ndef f(c):\n    return c._n\n",
           b: "import torch\n\ndef g(c, cfg):\n    return c._n + torch._dynamo.x + cfg._attn_implementation\n"}
    assert reaches(src) == ["panels/b.py:4 c._n"]  # the same read inside minivlm/x is its own business


# ---- the page says the engine's words from ids and fields, never by parsing its English (#53) ----
I18N = os.path.join(HERE, "panels", "i18n")
# panels/i18n/__init__.py reads gradio's own translation marker with a regex, not the engine's words
SAYS_THE_ENGINE = [os.path.join(I18N, f) for f in sorted(os.listdir(I18N)) if f.endswith(".py") and f != "__init__.py"] \
    + [os.path.join(HERE, "panels", "decisions.py")]


def imports_re(source: str) -> bool:
    tree = ast.parse(source)
    return any(isinstance(n, ast.Import) and any(a.name == "re" for a in n.names) or
               isinstance(n, ast.ImportFrom) and n.module == "re" for n in ast.walk(tree))


def test_the_page_never_parses_the_engines_english():
    """The decision log, refusals and status words are said from an event's fields or a message id (Refused, Said):
    the modules that say them in the page's language import no regex module."""
    assert [os.path.relpath(p, HERE) for p in SAYS_THE_ENGINE if imports_re(open(p, encoding="utf-8").read())] == []
    assert imports_re("import re\n") and imports_re("def f():\n    from re import match\n") and not imports_re("x = 1")
