"""The rooms of services/ import one way: rpc (the servicers) uses the engines, the engines every other room, and the
rest never reach back.

An import of a forbidden room anywhere in a module (top level or inside a function) fails the test, so a newcomer
who adds a shortcut learns it here rather than from an import loop.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "services"
CLIENT = ROOT / "client"
# Every package of vflsec by its folder (pyproject.toml's package-dir).
PACKAGES = {"vflsec": ROOT / "proto" / "vflsec", "vflsec.services": SERVICES, "vflsec.client": CLIENT}

# room -> rooms it must never import (directly or through a function-local import)
# (rpc -> engines -> models, defenses, plugins, crypto, data; only services/app.py imports rpc, and only app.py
# wires the links of transport/ into the engines, which name them for type checking only)
FORBIDDEN: dict[str, set[str]] = {
    "engines": {"rpc", "transport"},
    "transport": {"rpc", "engines"},
    "crypto": {"rpc", "engines", "transport", "models", "defenses", "attacks", "plugins", "data"},
    "data": {"rpc", "engines", "transport", "crypto", "models", "defenses", "attacks", "plugins"},
    "models": {"rpc", "engines", "transport", "defenses", "attacks", "plugins"},
    "defenses": {"rpc", "engines", "transport", "plugins"},
    "attacks": {"rpc", "engines", "transport", "plugins"},
    "plugins": {"rpc", "engines", "transport"},
    # the modules at the top of services/ that every room may use (app.py, which assembles the parties, is free)
    "common.py": {"rpc", "engines", "transport"},
    "config.py": {"rpc", "engines", "transport"},
    "errors.py": {"rpc", "engines", "transport"},
    "kinds.py": {"rpc", "engines", "transport"},
    "registry.py": {"rpc", "engines", "transport"},
}


# Model families: the packages under services/models/. Only a family's own package imports it, but for the modules
# that analyse or defend one family's released model; each of their plug-ins declares the families it supports
# (services/registry.py). Shared maths that is no family's (services/models/activations.py) ties nobody to one.
FAMILIES = sorted(p.name for p in (SERVICES / "models").iterdir() if (p / "__init__.py").exists())
FAMILY_READERS: dict[str, set[str]] = {
    "attacks": set(FAMILIES),  # an attack reads the released model of the family it attacks
    "defenses/params.py": {"lr"},  # parameter steps distort LR's weight blocks, checked on its linear system
    "defenses/scores.py": {"lr"},  # PPS-B perturbs LR's logits along its weights, in LR's released-score layout
}

# Protobuf and gRPC stay in the link layer: the servicers (rpc/), the links and the server (transport/), and app.py,
# which assembles them; every other module sees numpy, he objects and plain dataclasses.
LINK_LAYER = {"rpc", "transport", "app.py"}
WIRE_PACKAGES = ("grpc", "grpc_health", "grpc_reflection", "google.protobuf", "vflsec.v1")


def _runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node but those under ``if TYPE_CHECKING:`` (an import there is never executed)."""
    nodes: list[ast.AST] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        nodes.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                pending.extend(child.orelse)
            else:
                pending.append(child)
    return nodes


def imported_modules(path: Path, package: str | None = None) -> set[str]:
    """Every dotted name a module imports at run time (``from a import b`` gives a and a.b), relative imports
    resolved against the module's ``package`` (by default where it lies under services/)."""
    modules: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = []
            if node.level:
                parts = package.split(".") if package else ["vflsec", *path.relative_to(SERVICES.parent).parent.parts]
                base = parts[: len(parts) - node.level + 1]
            module = ".".join([*base, *([node.module] if node.module else [])])
            modules |= {module} | {f"{module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
    return modules


def imported_rooms(path: Path) -> set[str]:
    return {
        parts[2]
        for name in imported_modules(path)
        if (parts := name.split("."))[:2] == ["vflsec", "services"] and len(parts) > 2
    }


def imported_families(path: Path, package: str | None = None) -> set[str]:
    return {
        parts[3]
        for name in imported_modules(path, package)
        if (parts := name.split("."))[:3] == ["vflsec", "services", "models"] and len(parts) > 3
    } & set(FAMILIES)


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_rooms_import_one_way(room: str) -> None:
    modules = [SERVICES / room] if room.endswith(".py") else sorted((SERVICES / room).rglob("*.py"))
    assert all(m.exists() for m in modules) and modules, f"services/{room} has no modules"
    offenders = {
        str(path.relative_to(SERVICES)): sorted(imported_rooms(path) & FORBIDDEN[room])
        for path in modules
        if imported_rooms(path) & FORBIDDEN[room]
    }
    assert not offenders, f"services/{room} must not import {sorted(FORBIDDEN[room])}: {offenders}"


def test_the_scanner_sees_function_local_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from vflsec.services.engines import active\n    return active\n")
    assert imported_rooms(module) == {"engines"}


def test_the_scanner_skips_type_checking_imports_only(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from vflsec.services.transport import links\n"
        "else:\n    from vflsec.services.crypto import he\n"
        "if True:\n    from vflsec.services.data import datasets\n"
    )
    assert imported_rooms(module) == {"crypto", "data"}


def test_every_room_and_top_module_has_rules() -> None:
    """A new room or module at the top of services/ is given its rules here, not left out of the check."""
    present = {p.name for p in SERVICES.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    assert present - {"__init__.py", "app.py", "rpc", "__pycache__"} == set(FORBIDDEN)


def test_the_rooms_form_no_cycle() -> None:
    """Rooms (and top modules) import each other along a DAG: no room reaches itself through the others."""
    units = {p.name for p in SERVICES.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"} - {"__init__.py"}
    edges: dict[str, set[str]] = {}
    for unit in units:
        files = [SERVICES / unit] if unit.endswith(".py") else (SERVICES / unit).rglob("*.py")
        names = {n.split(".")[2] for f in files for n in imported_modules(f) if n.startswith("vflsec.services.")}
        edges[unit] = {u for u in units for n in names if u in (n, f"{n}.py")} - {unit}
    seen: set[str] = set()

    def visit(unit: str, path: tuple[str, ...]) -> None:
        assert unit not in path, f"rooms import each other in a cycle: {' -> '.join([*path, unit])}"
        if unit in seen:
            return
        for successor in sorted(edges[unit]):
            visit(successor, (*path, unit))
        seen.add(unit)

    for unit in sorted(units):
        visit(unit, ())


@pytest.mark.parametrize("family", FAMILIES)
def test_only_a_family_imports_itself(family: str) -> None:
    """Engines, transport, crypto, plugins, the family layer and the other families reach a family by name only
    (services/models/family.py ``get``), never by import."""
    def reader(path: Path) -> bool:
        relative = path.relative_to(SERVICES)
        return family in FAMILY_READERS.get(relative.parts[0], FAMILY_READERS.get(relative.as_posix(), set()))

    offenders = sorted(
        str(path.relative_to(SERVICES))
        for path in SERVICES.rglob("*.py")
        if path.relative_to(SERVICES).parts[:2] != ("models", family)
        and not reader(path)
        and family in imported_families(path)
    )
    assert not offenders, f"only services/models/{family}/ may import the {family} family: {offenders}"


def test_engines_name_no_lr() -> None:
    """Not even a name: what an engine needs of LR (its maths, its sizes) it asks the family for."""
    offenders = {}
    for path in sorted((SERVICES / "engines").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom | ast.Import)]
        names |= {alias.asname or alias.name for n in imports for alias in n.names}
        if "lr" in names or "models.lr" in path.read_text():
            offenders[path.name] = sorted(n for n in names if n == "lr")
    assert not offenders, f"engines must not name the lr family: {offenders}"


# A family's own steps and tensor names (split-NN's top_step, plain_forward; a tree's tree_* calls; LR's w_passive)
FAMILY_WORDS = re.compile(r"\btree_|\btop_step\b|\bplain_forward\b|\bbackward_gradient\b|\breleased_with\b|"
                          r"\bw_passive\b|\.tree\.|\bbias_offset/")


def test_engines_name_no_family_step() -> None:
    """The engines run a family's own messages through family_call, by the name the servicer passes: no engine names
    one, nor a family's tensors (what an engine needs of a family it asks through the family layer)."""
    offenders = {
        path.name: sorted(set(FAMILY_WORDS.findall(path.read_text())))
        for path in sorted((SERVICES / "engines").rglob("*.py"))
        if FAMILY_WORDS.search(path.read_text())
    }
    assert not offenders, f"engines must not name a family's steps or tensors: {offenders}"


def test_the_family_scanner_resolves_relative_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from ..models import lr\nfrom ..models.splitnn.steps import Bottom\nfrom . import sessions\n")
    assert imported_families(module, package="vflsec.services.engines") == {"lr", "splitnn"}


def test_only_the_link_layer_imports_grpc_or_protobuf() -> None:
    """Engines, models, defenses, crypto, ... take and return plain values; the servicers and links convert."""
    offenders = {
        str(relative): sorted(n for n in imported_modules(path) if n.startswith(WIRE_PACKAGES))
        for path in sorted(SERVICES.rglob("*.py"))
        if (relative := path.relative_to(SERVICES)).parts[0] not in LINK_LAYER
        and any(n.startswith(WIRE_PACKAGES) for n in imported_modules(path))
    }
    assert not offenders, f"only services/{{rpc,transport}}/ and app.py import gRPC or protobuf: {offenders}"


def test_only_app_imports_the_servicers() -> None:
    offenders = sorted(
        str(relative)
        for path in SERVICES.rglob("*.py")
        if (relative := path.relative_to(SERVICES)).parts[0] not in ("rpc", "app.py") and "rpc" in imported_rooms(path)
    )
    assert not offenders, f"only services/app.py imports services/rpc/: {offenders}"


def test_the_wire_scanner_sees_protobuf(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from vflsec.v1 import common_pb2\nimport grpc\n")
    assert {n for n in imported_modules(module, package="vflsec.services.engines") if n.startswith(WIRE_PACKAGES)} == {
        "vflsec.v1",
        "vflsec.v1.common_pb2",
        "grpc",
    }


# ------------------------------------------------------------------------------- modules: no circle, none too long

MAX_LINES = 1000


def module_name(path: Path, root: Path = SERVICES, prefix: str = "vflsec.services") -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join([prefix, *(parts[:-1] if parts[-1] == "__init__" else parts)])


def module_edges(roots: Mapping[str, Path] | None = None) -> dict[str, set[str]]:
    """Module -> the modules under ``roots`` (package name -> its folder; by default services/) it imports
    anywhere: at the top, inside a function, and under ``if TYPE_CHECKING:`` too (a type a module only names is
    still a dependency: two modules that name each other's types are one concern split in two, or a shared type in
    the wrong place). ``from a import b`` is an edge to the module a.b when there is one, else to a (a package's
    ``__init__``); a package's ``__init__`` is not reached through the modules below it."""
    roots = roots or {"vflsec.services": SERVICES}
    paths = {module_name(p, root, prefix): p for prefix, root in roots.items() for p in root.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                targets |= {f"{module}.{a.name}" if f"{module}.{a.name}" in paths else module for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        edges[name] = (targets & paths.keys()) - {name}
    return edges


def import_circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Circles of the import graph (each's modules in order, the first repeated at the end): at least one through
    every group of modules that reach each other, none when the graph is one-way."""
    circles: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            circles.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        for successor in sorted(edges[module]):
            visit(successor, [*path, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])
    return circles


def test_no_import_circle_in_services() -> None:
    """No module of services/ reaches itself through its imports, counting function-local and type-only ones."""
    circles = import_circles(module_edges())
    shown = "; ".join(" -> ".join(m.removeprefix("vflsec.services.") for m in circle) for circle in circles)
    assert not circles, f"import circles in services/: {shown}"


def test_the_circle_finder_sees_function_local_and_type_only_imports(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "__init__.py").write_text("")
    (root / "a.py").write_text("def f():\n    from pkg.sub import b\n    return b\n")
    (root / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n")
    (root / "sub" / "c.py").write_text("from pkg import a\n")
    (root / "d.py").write_text("from pkg.sub.c import x\n")
    edges = module_edges({"pkg": root})
    assert edges["pkg.d"] == {"pkg.sub.c"}
    assert import_circles(edges) == [["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"]]
    (root / "sub" / "c.py").write_text("X = 1\n")
    assert import_circles(module_edges({"pkg": root})) == []


def test_no_module_in_services_is_over_the_line_limit() -> None:
    """A module past a thousand lines holds more than one concern: split it by concern (services/data/ shows how)."""
    long = {
        str(path.relative_to(SERVICES)): n
        for path in sorted(SERVICES.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_module_in_client_is_over_the_line_limit() -> None:
    long = {
        str(path.relative_to(CLIENT)): n
        for path in sorted(CLIENT.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


# ------------------------------------------------------------------------------------------- the rooms of client/

# client/'s rooms and top modules -> the ones they must never import (anywhere in a module, TYPE_CHECKING too):
# cli.py assembles the commands (api.py runs them as functions) -> commands/ (one module per command group) ->
# experiments/ (harness, scenarios, the papers' claims) and bench/ (the `vflsec bench` measurements), which do not
# import each other -> federation/ (launcher, operator client, training, demo) -> the services; options.py (the
# CLI's shared declarations) and profiling.py sit under every room.
ENTRY = {"cli.py", "api.py"}
CLIENT_FORBIDDEN: dict[str, set[str]] = {
    "commands": ENTRY,
    "experiments": ENTRY | {"commands", "bench"},
    "bench": ENTRY | {"commands", "experiments"},
    "federation": ENTRY | {"commands", "experiments", "bench"},
    "options.py": ENTRY | {"commands", "experiments", "bench", "federation"},
    "profiling.py": ENTRY | {"commands", "experiments", "bench", "federation"},
}


def client_units(path: Path) -> set[str]:
    """The rooms and top modules of client/ a module imports (``vflsec.client.federation.launcher``: federation)."""
    units = {p.name for p in CLIENT.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    return {
        unit
        for name in imported_modules_anywhere(path, module_name(path, CLIENT, "vflsec.client"))
        if (parts := name.split("."))[:2] == ["vflsec", "client"] and len(parts) > 2
        for unit in units & {parts[2], f"{parts[2]}.py"}
    }


def imported_modules_anywhere(path: Path, module: str) -> set[str]:
    """Every dotted name a module imports, TYPE_CHECKING included, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            found = ".".join([*base, *([node.module] if node.module else [])])
            names |= {found} | {f"{found}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


@pytest.mark.parametrize("unit", sorted(CLIENT_FORBIDDEN))
def test_client_rooms_import_one_way(unit: str) -> None:
    modules = [CLIENT / unit] if unit.endswith(".py") else sorted((CLIENT / unit).rglob("*.py"))
    assert modules and all(m.exists() for m in modules), f"client/{unit} has no modules"
    offenders = {
        str(path.relative_to(CLIENT)): sorted(client_units(path) & CLIENT_FORBIDDEN[unit])
        for path in modules
        if client_units(path) & CLIENT_FORBIDDEN[unit]
    }
    assert not offenders, f"client/{unit} must not import {sorted(CLIENT_FORBIDDEN[unit])}: {offenders}"


def test_every_client_room_and_top_module_has_rules() -> None:
    """A new room or top module of client/ is given its place here; the top holds few modules."""
    present = {p.name for p in CLIENT.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    assert present - {"__init__.py"} - ENTRY == set(CLIENT_FORBIDDEN)
    assert len([p for p in CLIENT.glob("*.py")]) <= 8, "client/'s top holds at most 8 modules"


def test_services_never_import_the_client() -> None:
    offenders = sorted(
        str(path.relative_to(SERVICES))
        for path in SERVICES.rglob("*.py")
        if any(n.startswith("vflsec.client") for n in imported_modules_anywhere(path, module_name(path)))
    )
    assert not offenders, f"services/ must not import vflsec.client: {offenders}"


def test_no_import_circle_anywhere_in_vflsec() -> None:
    """No module of vflsec (the protocol package, services/, client/) reaches itself through its imports, counting
    function-local and type-only ones: a circle is two concerns that lean on each other, to be cut where one
    reaches back (as cli.py <-> experiment.py was, issue #30)."""
    circles = import_circles(module_edges(PACKAGES))
    shown = "; ".join(" -> ".join(circle) for circle in circles)
    assert not circles, f"import circles in vflsec: {shown}"


def test_the_client_rule_scanner_sees_function_local_and_type_only_imports(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from vflsec.client.commands.common import fail\n"
        "def f():\n    from vflsec.client import cli\n    from ..bench import he\n"
    )
    names = imported_modules_anywhere(module, "vflsec.client.federation.m")
    assert {"vflsec.client.commands.common", "vflsec.client.cli", "vflsec.client.bench.he"} <= names
