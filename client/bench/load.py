"""``vflsec bench load``: many concurrent prediction requests against one federation.

One in-process federation (coordinator, active, one passive party; real gRPC servers on loopback, mTLS,
CKKS by default), a model trained for a few epochs, then ``n_requests`` Predict calls of a few samples each,
kept ``concurrency`` at a time by as many asyncio callers on one thread over one shared channel, as an operator's
asyncio front end would (a thread per caller cost the load generator 1.7 times the CPU per request, on the cores the
parties share). It reports latency percentiles and throughput, and checks that nothing was dropped: every request
must answer OK with one score row per asked sample, for exactly the samples asked. With ``processes``, the same load
also runs against a federation whose parties are each their own ``vflsec serve`` process (the deployment shape, the
commands compose runs: no shared GIL), reported beside the in-process figure under ``"processes"``. The CPU time
the load took (user + system, of this process and, with processes, of each party process) is under
``"cpu_seconds"``.

    python -m vflsec.client.bench.load --processes --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from vflsec.client.bench import usage
from vflsec.client.federation.launcher import (
    FederationLayout,
    FederationSpec,
    run_in_process,
    run_processes,
    write_federation,
)
from vflsec.client.federation.operator import Operator, predict_request, released
from vflsec.services.data import datasets
from vflsec.v1 import active_pb2_grpc


@dataclass(frozen=True)
class Outcome:
    """One request: its latency and whether the answer was complete and well-formed."""

    seconds: float
    status: str  # gRPC status name; "OK" when answered
    well_formed: bool


async def _request(stub: active_pb2_grpc.ActiveStub, session_id: str, ids: Sequence[str], n_classes: int) -> Outcome:
    start = time.perf_counter()
    try:
        answer = released(await stub.Predict(predict_request(session_id, ids)))
    except grpc.RpcError as exc:  # grpc.aio's AioRpcError is one
        return Outcome(time.perf_counter() - start, exc.code().name, False)
    seconds = time.perf_counter() - start
    well_formed = (
        answer.sample_ids == list(ids)
        and answer.scores.shape == (len(ids), n_classes)
        and bool(np.isfinite(answer.scores).all())
    )
    return Outcome(seconds, "OK", well_formed)


async def _issue(
    layout: FederationLayout, session_id: str, requests: Sequence[Sequence[str]], concurrency: int, n_classes: int
) -> list[Outcome]:
    """Every request, ``concurrency`` callers each taking the next one as its last is answered; outcomes in order."""
    outcomes: list[Outcome] = [None] * len(requests)  # type: ignore[list-item]  # each set by one caller
    pending = iter(enumerate(requests))

    async def caller(stub: active_pb2_grpc.ActiveStub) -> None:
        for i, ids in pending:
            outcomes[i] = await _request(stub, session_id, ids, n_classes)

    async with layout.operator_channel(aio=True) as channel:
        stub = active_pb2_grpc.ActiveStub(channel)
        await asyncio.gather(*(caller(stub) for _ in range(concurrency)))
    return outcomes


def _draw_requests(common: Sequence[str], n_requests: int, samples: int, seed: int) -> list[list[str]]:
    rng = np.random.default_rng(seed)
    return [[common[i] for i in rng.choice(len(common), size=samples, replace=False)] for _ in range(n_requests)]


def run(
    n_requests: int = 1000,
    concurrency: int = 32,
    samples_per_request: int = 4,
    backend: str = "ckks",
    dataset: str = "breast_cancer",
    epochs: int = 2,
    seed: int = 0,
    log: Callable[[str], None] = print,
    processes: bool = False,
) -> dict[str, Any]:
    """Run the load test (scores are released only from a trained model, so ``epochs`` >= 1): in-process, and with
    ``processes`` also with each party its own process (under the ``"processes"`` key, the same fields)."""
    if n_requests < 1 or concurrency < 1 or samples_per_request < 1 or epochs < 1:
        raise ValueError("n_requests, concurrency, samples_per_request and epochs must be >= 1")
    ds = datasets.load_dataset(dataset)
    modes: dict[str, Callable] = {"in-process": run_in_process}
    if processes:
        modes["processes"] = run_processes  # the same commands compose runs, one `vflsec serve` per party
    results = {}
    for mode, start_parties in modes.items():
        log(
            f"{mode}: {n_requests} Predict requests of {samples_per_request} samples, "
            f"{concurrency} concurrent callers, {backend}"
        )
        load = (n_requests, concurrency, samples_per_request, backend, epochs, seed)
        outcomes, wall, cpu = _load(start_parties, ds, *load)
        results[mode] = _summarise(outcomes, wall, concurrency, samples_per_request, backend, ds.name, log)
        results[mode]["cpu_seconds"] = cpu
        log(f"CPU {sum(cpu.values()):.2f} s: " + ", ".join(f"{name} {sec:.2f} s" for name, sec in cpu.items()))
    result = results["in-process"]
    if processes:
        result["processes"] = results["processes"]
    return result


def _load(
    start_parties: Callable,
    ds: datasets.Dataset,
    n_requests: int,
    concurrency: int,
    samples: int,
    backend: str,
    epochs: int,
    seed: int,
) -> tuple[list[Outcome], float, dict[str, float]]:
    """A fresh federation started by ``start_parties``, a model trained, then the timed concurrent requests: their
    outcomes, wall seconds and CPU seconds (usage.cpu_seconds)."""
    with tempfile.TemporaryDirectory(prefix="vflsec-load-") as tmp:
        layout = write_federation(FederationSpec(ds, n_passive=1, seed=seed, backend=backend), Path(tmp))
        with start_parties(layout) as fed, layout.operator_channel() as channel:
            operator = Operator(channel)
            info = operator.create_session(backend, batch_size=64, learning_rate=0.1, seed=seed)
            common = operator.align(info.session_id)
            for _ in operator.train(info.session_id, common, epochs):
                pass
            requests = _draw_requests(common, n_requests, min(samples, len(common)), seed)
            pids = usage.party_pids(fed)
            cpu = usage.cpu_seconds(pids)
            start = time.perf_counter()
            outcomes = asyncio.run(_issue(layout, info.session_id, requests, concurrency, info.n_classes))
            wall = time.perf_counter() - start
            cpu = usage.since(cpu, pids)
            operator.close(info.session_id)
    return outcomes, wall, cpu


def _summarise(
    outcomes: Sequence[Outcome],
    wall: float,
    concurrency: int,
    samples: int,
    backend: str,
    dataset: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    latency_ms = np.array([o.seconds for o in outcomes]) * 1e3
    answered = sum(o.status == "OK" and o.well_formed for o in outcomes)
    result = {
        "backend": backend,
        "dataset": dataset,
        "requests": len(outcomes),
        "concurrency": concurrency,
        "samples_per_request": samples,
        "answered_ok": answered,
        "dropped": len(outcomes) - answered,
        "statuses": dict(Counter(o.status for o in outcomes)),
        "malformed_answers": sum(o.status == "OK" and not o.well_formed for o in outcomes),
        "latency_ms": {
            "p50": float(np.percentile(latency_ms, 50)),
            "p99": float(np.percentile(latency_ms, 99)),
            "max": float(latency_ms.max()),
            "mean": float(latency_ms.mean()),
        },
        "wall_seconds": wall,
        "requests_per_second": len(outcomes) / wall,
        "samples_per_second": len(outcomes) * samples / wall,
    }
    lat = result["latency_ms"]
    log(
        f"latency p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms, max {lat['max']:.1f} ms; "
        f"throughput {result['requests_per_second']:.1f} requests/s ({result['samples_per_second']:.0f} samples/s); "
        f"answered {answered}/{len(outcomes)}, dropped {result['dropped']}"
    )
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m vflsec.client.bench.load", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--samples", type=int, default=4, help="samples per request")
    parser.add_argument("--backend", choices=("ckks", "plain"), default="ckks")
    parser.add_argument("--dataset", default="breast_cancer")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--processes", action="store_true", help="also with each party its own process")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = parser.parse_args(argv)
    log = (lambda line: print(line, file=__import__("sys").stderr)) if args.json else print
    result = run(
        args.requests, args.concurrency, args.samples, args.backend, args.dataset, args.epochs, log=log,
        processes=args.processes,
    )
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
