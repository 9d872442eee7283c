"""Imports run one way, layer by layer, with no cycles; the attack factory fills the one list of attacks the
settings schema accepts.

The layers, top first (a module imports only from its own layer or below):
  5 deploy/                  the container and deployment tools
  4 commands/                command line and launchers (the `flwr run` driver, Flower's simulation engine, the
                             in-process transport), grids, frontiers
  3 server.app, clients/     the ServerApp and the ClientApp
  2 strategies/              the protocols, written once against Flower's Grid
  1 server/ (but server.app) the services the protocols use: context, store, validation, plausibility, traffic,
                             results, resume, the adversary
  0 fedsmix/                 the shared library (never Flower)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from fedsmix.registry import ATTACKS
from server.adversary.registry import applicable

ROOT = Path(__file__).resolve().parent.parent


def imported_packages(folder: str, skip: tuple[str, ...] = ()) -> dict[str, set[str]]:
    out = {}
    for path in (ROOT / folder).rglob("*.py"):
        if path.name in skip:
            continue
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[str(path.relative_to(ROOT))] = names
    return out


PACKAGES = ("fedsmix", "server", "strategies", "clients", "commands", "deploy")


def module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (anywhere in the file, lazy imports too)."""
    paths = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def resolve(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else [])
                                ) if node.level else node.module
                submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in paths]
                names |= set(submodules) if len(submodules) == len(node.names) else {base, *submodules}
        graph[module] = {found for name in names if (found := resolve(name)) and found != module}
    return graph


def layer(module: str) -> int:
    top = module.split(".")[0]
    if top in ("deploy", "commands"):
        return 5 if top == "deploy" else 4
    if module == "server.app" or top == "clients":
        return 3
    return {"strategies": 2, "server": 1}.get(top, 0)


def test_no_module_imports_from_a_layer_above_its_own():
    upward = [f"{m} -> {d}" for m, deps in module_graph().items() for d in deps if layer(d) > layer(m)]
    assert upward == []


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every import cycle a depth-first walk closes (a module met again on the current path)."""
    state, found = {}, []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph[module]):
            if state.get(dep) == "open":
                found.append(" -> ".join([*path[path.index(dep):], module, dep] if dep in path else [module, dep]))
            elif dep not in state:
                visit(dep, [*path, module])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [])
    return found


def test_no_import_cycles():
    assert cycles(module_graph()) == []


def test_the_checks_see_a_cycle_and_an_upward_import(tmp_path, monkeypatch):
    """The two rules above on a made-up tree: they must fail where the rule is broken."""
    for name, text in {"fedsmix/a.py": "from fedsmix import b\n", "fedsmix/b.py": "import fedsmix.a\n",
                       "fedsmix/c.py": "from server.store import x\n", "server/store.py": "", "server/__init__.py": "",
                       "fedsmix/__init__.py": ""}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = module_graph()
    assert graph["fedsmix.a"] == {"fedsmix.b"} and graph["fedsmix.b"] == {"fedsmix.a"}
    assert cycles(graph) == ["fedsmix.a -> fedsmix.b -> fedsmix.a"]
    assert [d for d in graph["fedsmix.c"] if layer(d) > layer("fedsmix.c")] == ["server.store"]


def test_the_library_imports_neither_flower_nor_the_apps():
    for path, names in imported_packages("fedsmix").items():
        assert not names & {"flwr", "server", "strategies", "clients", "commands"}, path


def test_protocols_and_apps_never_import_the_commands_or_the_clients():
    for folder in ("server", "strategies"):
        for path, names in imported_packages(folder).items():
            assert not names & {"clients", "commands"}, path
    for path, names in imported_packages("clients").items():
        assert not names & {"server", "strategies", "commands"}, path


def test_the_attack_factory_fills_the_schemas_list_of_attacks():
    assert ATTACKS.names()[:3] == ("linear", "mmse", "mmse-centred") and ATTACKS["mmse-centred"].needs_public
    assert applicable("singularized") == ("linear", "mmse", "mmse-centred", "unet", "refined",
                                          "refined-centred", "abs-solve", "averaging")
    assert applicable("fedprox") == ("gradient", "gradient-realistic") and applicable("local-only") == ()
