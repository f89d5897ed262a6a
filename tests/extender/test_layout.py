"""The layout holds: no import cycle, every package imports only those below it, and the core stays pure.

Imports are read with `ast`, so those under `if TYPE_CHECKING:` and inside functions count too: each still says
that one module needs the other. ARCHITECTURE.md draws the order these tests hold the packages to.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]

# extender's packages, lowest first; one rank may hold several that must not import each other.
LAYERS: tuple[tuple[str, ...], ...] = (("api",), ("kube",), ("cache",), ("groups",), ("verbs",), ("pinning",),
                                       ("server",), ("kubectl", "demo"), ("cli",))
RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}
EDGE_LIBRARIES = frozenset({"grpc", "pynvml", "kubernetes", "fastapi", "starlette", "uvicorn", "httpx", "urllib3",
                            "http", "extender"})
MAX_ENTRIES = 10


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, name: str, modules: frozenset[str]) -> set[str]:
    """The modules `path` imports: for `from a.b import c`, a.b.c where that is a module, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in modules else base)
    return found


@cache
def graph() -> nx.DiGraph:
    """Every module of the project's two packages, and an edge for each import between two of them."""
    paths = [path for package in ("extender", "topology") for path in sorted((ROOT / package).rglob("*.py"))]
    names = {path: _module_name(path) for path in paths}
    modules = frozenset(names.values())
    imports = nx.DiGraph()
    for path, name in names.items():
        imports.add_node(name, external=set())
        for target in _imported(path, name, modules):
            if target in modules:
                imports.add_edge(name, target)
            else:
                imports.nodes[name]["external"].add(target.split(".")[0])
    return imports


def _extender_package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "extender" and len(parts) > 1 else None


def test_no_import_cycle() -> None:
    cycles = list(nx.simple_cycles(graph()))
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(cycle + cycle[:1]) for cycle in cycles[:5])


def test_every_extender_package_imports_only_those_below_it() -> None:
    upward = []
    for source, target in graph().edges:
        above, below = _extender_package(source), _extender_package(target)
        if above is None or below is None or above == below:
            continue
        if RANK[below] >= RANK[above]:
            upward.append(f"{source} -> {target}")
    assert not upward, "imports against the layer order of ARCHITECTURE.md: " + ", ".join(sorted(upward))


def test_every_extender_package_has_a_rank() -> None:
    packages = {path.name for path in (ROOT / "extender").iterdir() if (path / "__init__.py").exists()}
    modules = {path.stem for path in (ROOT / "extender").glob("*.py") if path.stem != "__init__"}
    assert packages | modules == set(RANK)


def test_the_core_imports_neither_the_agent_nor_an_edge_library() -> None:
    imports = graph()
    impure = {}
    for module in imports:
        if module.split(".")[0] != "topology" or module.startswith("topology.agent"):
            continue
        agent = sorted(target for target in imports.successors(module) if target.startswith("topology.agent"))
        edge = sorted(imports.nodes[module]["external"] & EDGE_LIBRARIES)
        if agent or edge:
            impure[module] = agent + edge
    assert not impure


@pytest.mark.parametrize("folder", ["extender", *(f"extender/{package}" for packages in LAYERS[:-1]
                                                 for package in packages), "tests", "tests/extender"])
def test_a_folder_holds_about_ten_entries(folder: str) -> None:
    entries = [path for path in (ROOT / folder).iterdir()  # not caches nor what a build or a tool leaves
               if path.name != "__pycache__" and not path.name.endswith(".so") and not path.name.startswith(".")]
    assert len(entries) <= MAX_ENTRIES + 1, sorted(path.name for path in entries)


@pytest.mark.parametrize("package", [packages for layer in LAYERS[:-1] for packages in layer])
def test_each_package_says_what_it_owns_and_may_import(package: str) -> None:
    docstring = ast.get_docstring(ast.parse((ROOT / "extender" / package / "__init__.py").read_text()))
    assert docstring and "import" in docstring.lower()


def test_the_walk_sees_a_cycle_hidden_behind_type_checking(tmp_path: Path) -> None:
    source = tmp_path / "a.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from extender.cache import ledger\n")
    assert _imported(source, "extender.cache.cluster_state", frozenset({"extender.cache.ledger"})) == {
        "typing", "extender.cache.ledger"}
