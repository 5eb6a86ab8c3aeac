"""`vflsec reproduce` runs from the package alone, as installed from a wheel: nothing it imports or loads lies
outside the package's own folders (no scripts/ of a source checkout)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from vflsec.client.experiments.reproduce import run as rep
from vflsec.services.data import datasets

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, sys
from vflsec.client.experiments.reproduce import run as rep
row = rep.run_claim(rep.CLAIMS[sys.argv[1]])
files = [getattr(m, "__file__", None) or "" for n, m in list(sys.modules.items()) if n.split(".")[0] == "vflsec"]
print(json.dumps({"verdict": row["verdict"], "reason": row.get("reason"), "files": files}))
"""


def _installed_copy(target: Path) -> Path:
    """The package's folders laid out as a wheel installs them (pyproject's package-dir), nothing else."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, folder in sorted(mapping.items()):
        shutil.copytree(ROOT / folder, target / package.replace(".", "/"), dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))  # fmt: skip
    return target


@pytest.mark.parametrize("claim", ["ye_alg1_covid", "luo_worked_example"])
def test_claims_run_from_the_installed_package_alone(claim: str, tmp_path: Path) -> None:
    if rep.missing_datasets(rep.CLAIMS[claim]):
        pytest.skip(f"{claim} needs {rep.CLAIMS[claim].datasets}, absent here")
    site = _installed_copy(tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": str(site)}  # found before the editable install's finder
    if datasets.shared_datasets_dir() is not None:
        env[datasets.DATASETS_ENV_VAR] = str(datasets.shared_datasets_dir())
    done = subprocess.run([sys.executable, "-c", PROBE, claim], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["verdict"] == "reproduced", result["reason"]
    outside = [f for f in result["files"] if f and not Path(f).resolve().is_relative_to(site.resolve())]
    assert not outside, outside
