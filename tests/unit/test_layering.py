"""The rooms of services/ import one way: engines may use every other room, the rest never reach back.

An import of a forbidden room anywhere in a module (top level or inside a function) fails the test, so a newcomer
who adds a shortcut learns it here rather than from an import loop.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"

# room -> rooms it must never import (directly or through a function-local import)
FORBIDDEN: dict[str, set[str]] = {
    "crypto": {"engines", "transport", "models", "defenses", "attacks", "plugins", "data"},
    "data": {"engines", "transport", "crypto", "models", "defenses", "attacks", "plugins"},
    "models": {"engines", "transport", "defenses", "attacks", "plugins"},
    "defenses": {"engines", "transport", "plugins"},
    "attacks": {"engines", "transport", "plugins"},
    "plugins": {"engines", "transport"},
}


def imported_rooms(path: Path) -> set[str]:
    rooms: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["vflsec", "services"] and len(parts) > 2:
                rooms.add(parts[2])
    return rooms


@pytest.mark.parametrize("room", sorted(FORBIDDEN))
def test_rooms_import_one_way(room: str) -> None:
    modules = sorted((SERVICES / room).rglob("*.py"))
    assert modules, f"services/{room}/ has no modules"
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


def test_every_package_under_services_is_installed() -> None:
    """A non-editable install (the Dockerfile's) ships only the packages pyproject lists."""
    import tomllib

    listed = set(tomllib.loads((SERVICES.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        "vflsec." + ".".join(("services", *init.parent.relative_to(SERVICES).parts))
        for init in SERVICES.rglob("__init__.py")
    }
    assert on_disk <= listed, f"add to pyproject's packages: {sorted(on_disk - listed)}"
