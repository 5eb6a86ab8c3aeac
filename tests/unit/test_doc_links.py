"""README.md and docs/ point at things that exist: every relative markdown link resolves (from the file that holds
it), every repository path of code they name in backticks (``client/federation/launcher.py``,
``benchmarks/bench_tree.py``) is a file or folder, and every ``python -m vflsec...`` they show is a module.

A file moved (issue #30 gave client/ its rooms and took the scratch measurements out of the package) takes its
mentions with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *ROOT.glob("*/README.md")])

LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
CODE = re.compile(r"`([^`\n]+)`")
# The folders of code; a mention of examples/ or docs/ may name a file still to come ("left of issue 29: ...").
CODE_PATH = re.compile(r"(?<![\w./-])((?:client|services|scripts|benchmarks|proto)/[\w./-]*\w)")
MODULE = re.compile(r"python -m (vflsec(?:\.\w+)*)")
# The package's folders in the repository (pyproject.toml's package-dir).
PACKAGE_DIRS = {"vflsec.client": "client", "vflsec.services": "services", "vflsec": "proto/vflsec"}


def _module_file(module: str) -> Path | None:
    for package in sorted(PACKAGE_DIRS, key=len, reverse=True):
        if module == package or module.startswith(f"{package}."):
            base = ROOT / PACKAGE_DIRS[package] / Path(*module.removeprefix(package).lstrip(".").split("."))
            for candidate in (base.with_suffix(".py"), base / "__main__.py"):
                if candidate.exists():
                    return candidate
            return None
    return None


def _named(document: Path) -> tuple[list[str], list[str], list[str]]:
    text = document.read_text()
    links = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    code = CODE.findall(text)
    paths = [p.split("::")[0] for snippet in code for p in CODE_PATH.findall(snippet)]
    modules = [m for snippet in code for m in MODULE.findall(snippet)]
    return links, paths, modules


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_paths_and_modules_resolve(document: Path) -> None:
    links, paths, modules = _named(document)
    broken = [f"link {t}" for t in links if not (document.parent / t).exists()]
    broken += [f"path {p}" for p in paths if not (ROOT / p).exists()]
    broken += [f"module {m}" for m in modules if _module_file(m) is None]
    assert not broken, f"{document.relative_to(ROOT)} names what does not exist: {broken}"


def test_the_checker_sees_a_broken_link_path_and_module(tmp_path: Path) -> None:
    document = tmp_path / "doc.md"
    document.write_text("[a](missing.md) `client/nowhere.py::f` `python -m vflsec.client.nowhere --json`\n")
    assert _named(document) == (["missing.md"], ["client/nowhere.py"], ["vflsec.client.nowhere"])
    assert _module_file("vflsec.client.nowhere") is None
    assert _module_file("vflsec.client.cli") == ROOT / "client" / "cli.py"
