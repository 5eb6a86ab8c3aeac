"""PSI blinding throughput (IDs/s on one core): hash + blind own IDs, validate + re-blind the other's.

    .venv/bin/python benchmarks/bench_psi.py [--n 5000] [--rounds 3] [--module path/to/psi.py]

``--module`` measures another implementation of ``services/crypto/psi.py`` (e.g. an older commit's, from
``git show REV:services/crypto/psi.py``) with the same IDs, alternating with the current one so both see the same
machine load. Prints one JSON object; the best round is the least disturbed by other load.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from types import ModuleType

from vflsec.services.crypto import psi


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("psi_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


def _round(module: ModuleType, ids: list[str]) -> tuple[float, float]:
    salt, a, b = module.new_salt(), module.PsiKey(), module.PsiKey()
    start = time.perf_counter()
    blinded = a.blind_ids(ids, salt)
    blind = time.perf_counter() - start
    start = time.perf_counter()
    b.reblind(blinded)
    return len(ids) / blind, len(ids) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--module", help="another psi.py to measure alongside")
    args = parser.parse_args()
    os.environ[psi.WORKERS_ENV] = "1"  # one core, as the figures say (vflsec bench align measures the pool)
    modules = {"current": psi, **({"other": _load(args.module)} if args.module else {})}
    ids = [f"customer-{i:07d}" for i in range(args.n)]
    rates: dict[str, list[tuple[float, float]]] = {name: [] for name in modules}
    for _ in range(args.rounds):
        for name, module in modules.items():
            rates[name].append(_round(module, ids))
    result = {
        name: {
            "blind_ids_per_second": round(max(r[0] for r in runs)),
            "reblind_ids_per_second": round(max(r[1] for r in runs)),
        }
        for name, runs in rates.items()
    }
    print(json.dumps({"n": args.n, "rounds": args.rounds, **result}))


if __name__ == "__main__":
    main()
