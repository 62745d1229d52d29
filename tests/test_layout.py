"""The import graph has three floors and no arrow back up: ``experiments`` (the cross-method
tools) may import the method packages and ``common``; each method package (``arco``, ``cer``,
``eviback``) imports ``common`` and itself only; ``common`` imports none of them. Every import
counts, at module level or inside a function, read from the source with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("arco", "cer", "eviback")
PACKAGES = ("common", *METHODS, "experiments")
# what each floor may import, besides itself
ALLOWED = {
    "common": set(),
    **{m: {"common"} for m in METHODS},
    "experiments": {"common", *METHODS},
}
# Known arrows up, each with its reason; an entry no longer needed fails the test, so it goes.
KNOWN: set[tuple[str, str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports (absolute names; relative imports resolved)."""
    return imports_of(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_of(text: str, name: str, is_package: bool) -> set[str]:
    package = name.split(".") if is_package else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def upward_arrows() -> set[tuple[str, str]]:
    arrows = set()
    for path in sources():
        name = module_name(path)
        floor = name.split(".")[0]
        for target in imported(path):
            top = target.split(".")[0]
            if top in PACKAGES and top != floor and top not in ALLOWED[floor]:
                arrows.add((name, top))
    return arrows


def test_every_package_is_seen():
    names = {module_name(p) for p in sources()}
    for pkg in PACKAGES:
        assert pkg in names, f"{pkg}/__init__.py not found"
    assert "experiments.evaluate_all" in names and "common.evaluate_all" not in names


def test_imports_point_down_only():
    arrows = upward_arrows()
    new = sorted(arrows - KNOWN)
    assert not new, "imports against the floors (module -> package): " + ", ".join(
        f"{m} -> {t}" for m, t in new
    )
    gone = sorted(KNOWN - arrows)
    assert not gone, f"KNOWN lists arrows that are gone, remove them: {gone}"


def test_imports_of_resolves_relative_and_lazy_imports():
    text = "from . import rl\nfrom .train import logging\n\n\ndef f():\n    import cer.config\n"
    got = imports_of(text, "common.probe", is_package=False)
    assert {"common.rl", "common.train", "common.train.logging", "cer.config"} <= got
    assert "common.x" in imports_of("from .x import y\n", "common", is_package=True)


def project_graph() -> dict[str, set[str]]:
    """Module -> the project modules (and packages) it imports, lazily or not."""
    names = {module_name(p): p for p in sources()}
    return {n: {t for t in imported(p) if t in names and t != n} for n, p in names.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_circles_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle():
    """No two project modules import each other, directly or through others (once the circles
    experiments.evaluate_all <-> evaluate_plots and common.tinyworld.build <-> model)."""
    assert circles(project_graph()) == []
