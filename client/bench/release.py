"""Latency of the coordinator's score-release defenses, per batch and per single vector.

Run ``python -m vflsec.client.bench.release`` (optionally ``--batch N --ks 10,100``): it prints a table and,
as its last line, one JSON object with every number. Each figure is the best of ``repeats`` runs of the
release chain the coordinator would build from the spec (model-dependent caches warm, as in a session), on
softmax scores of Gaussian logits. ``reference_seconds`` times a straightforward per-row PRIVEE (a Python
loop over the rows) for comparison with the vectorised step; ``setup_seconds`` times PPS-B's one-off v_1 per
model. The PRIVEE paper reports 0.145 s at K = 10,000 (1,000 vectors).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from vflsec.services.defenses.release import ReleaseContext, ScoreReleaseChain
from vflsec.services.defenses.scores import gaussian_sigma, pps_b_direction
from vflsec.services.models.lr import softmax

DEFENSES: dict[str, str] = {
    "privee": "privee:epsilon=0.1",
    "privee_pp": "privee_pp:epsilons=0.05:0.1",
    "gaussian": "gaussian:epsilon=0.1",
    "rounding": "rounding:decimals=3",
    "pps_b1": "pps_b:scheme=1,alpha=1",
    "pps_b2": "pps_b:scheme=2,alpha=1",
    "pps_b3": "pps_b:scheme=3,alpha=0.5",
    "label_only": "label_only",
    "rank_only": "rank_only",
}
PASSIVE_FEATURES = (10, 10)  # two passive parties; PPS-B's v_1 depends on their weight blocks


def _best_of(repeats: int, action: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def reference_privee(
    scores: np.ndarray,
    rng: np.random.Generator,
    epsilon: float = 0.1,
    delta: float = 1e-5,
    sensitivity: float = 0.1,
    upper: float = 3.0,
) -> np.ndarray:
    """PRIVEE-DP (identity basis) one row at a time, as Algorithm 1 reads; no tie handling."""
    sigma = gaussian_sigma(epsilon, delta, sensitivity)
    released = np.empty_like(scores)
    k = scores.shape[1]
    lows = upper * np.arange(k) / k
    for row, c in enumerate(scores):
        order = np.argsort(c)
        u = rng.uniform(lows, lows + upper / k)
        released[row, order] = c[order] * (1.0 + sigma * u)
    return released


def _workload(batch: int, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, ReleaseContext]:
    logits = rng.normal(scale=3.0, size=(batch, k))
    passive = {f"passive-{i}": rng.normal(size=(k, d)) for i, d in enumerate(PASSIVE_FEATURES)}
    context = ReleaseContext(rng=np.random.default_rng(rng.integers(2**63)), n_classes=k, passive_weights=passive)
    return softmax(logits), logits, context


def run(batch: int = 1000, ks: tuple[int, ...] = (10, 100, 1000, 10000), repeats: int = 5) -> dict:
    """Seconds per release of a ``batch``-vector batch and of a single vector, per defense and K."""
    rng = np.random.default_rng(20251222)
    latency: dict[str, dict[str, float]] = {name: {} for name in DEFENSES}
    single: dict[str, dict[str, float]] = {name: {} for name in DEFENSES}
    reference: dict[str, dict[str, float]] = {"privee": {}}
    setup: dict[str, dict[str, float]] = {"pps_b": {}}
    for k in ks:
        scores, logits, context = _workload(batch, k, rng)
        for name, spec in DEFENSES.items():
            chain = ScoreReleaseChain.from_specs([spec])
            chain(scores, logits, context)  # warm caches (σ per rank, v_1, worker threads)
            latency[name][str(k)] = _best_of(repeats, partial(chain, scores, logits, context))
            single[name][str(k)] = _best_of(repeats, partial(chain, scores[:1], logits[:1], context))
        # v_1 is computed once per model (then cached): an SVD of the d x K matrix A⁺J.
        setup["pps_b"][str(k)] = _best_of(repeats, partial(pps_b_direction, context.passive_weights))
        reference["privee"][str(k)] = _best_of(max(1, repeats // 2), partial(reference_privee, scores, context.rng))
    return {
        "batch": batch,
        "latency_seconds": latency,
        "single_vector_seconds": single,
        "reference_seconds": reference,
        "setup_seconds": setup,
    }


def table(result: dict) -> str:
    ks = list(next(iter(result["latency_seconds"].values())))
    header = f"{'defense (ms)':<22}" + "".join(f"{'K=' + k:>12}" for k in ks)
    lines = [f"batch = {result['batch']} vectors, best of several runs", header, "-" * len(header)]
    rows = [(name, times) for name, times in result["latency_seconds"].items()]
    rows += [("privee per-row ref.", result["reference_seconds"]["privee"])]
    rows += [(f"{name} (1 vector)", times) for name, times in result["single_vector_seconds"].items()]
    rows += [("pps_b v_1 (per model)", result["setup_seconds"]["pps_b"])]
    lines += [f"{name:<22}" + "".join(f"{1e3 * times[k]:>12.3f}" for k in ks) for name, times in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--ks", default="10,100,1000,10000", help="comma-separated class counts")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    result = run(args.batch, tuple(int(k) for k in args.ks.split(",")), args.repeats)
    print(table(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
