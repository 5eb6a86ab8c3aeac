"""The README reads as user documentation (issue 31, item 7): a quickstart that runs `vflsec attack`, short lines,
and links that point at files of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_the_readme_has_a_quickstart_with_attack_and_short_lines() -> None:
    quickstart = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    assert "vflsec attack --dataset" in quickstart and "--release" in quickstart and "Half" in quickstart
    long = [(n, len(line)) for n, line in enumerate(README.splitlines(), 1) if len(line) >= 200]
    assert not long, f"README lines of 200 characters or more: {long}"


def test_the_readme_links_to_files_that_exist() -> None:
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
