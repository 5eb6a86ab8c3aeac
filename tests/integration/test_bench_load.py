"""The load benchmark answers every concurrent request completely (timings are printed, never asserted)."""

from __future__ import annotations

from vflsec.client.bench import load as bench_load


def test_no_request_is_dropped_under_concurrency() -> None:
    lines: list[str] = []
    result = bench_load.run(n_requests=50, concurrency=8, samples_per_request=3, epochs=1, log=lines.append)
    assert result["requests"] == 50
    assert result["statuses"] == {"OK": 50}
    assert result["malformed_answers"] == 0 and result["dropped"] == 0 and result["answered_ok"] == 50
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p99"] <= result["latency_ms"]["max"]
    assert any("dropped 0" in line for line in lines)


def test_parties_as_processes_answer_every_request_too() -> None:
    """--processes: each party its own `vflsec serve` process; its figure sits beside the in-process one."""
    lines: list[str] = []
    result = bench_load.run(
        n_requests=40, concurrency=8, samples_per_request=3, epochs=1, log=lines.append, processes=True
    )
    assert list(result)[: list(result).index("processes")] == [
        "backend", "dataset", "requests", "concurrency", "samples_per_request", "answered_ok", "dropped", "statuses",
        "malformed_answers", "latency_ms", "wall_seconds", "requests_per_second", "samples_per_second",
        "cpu_seconds",  # new keys go last (the earlier ones keep their places)
    ]  # fmt: skip
    for figure in (result, result["processes"]):
        assert figure["requests"] == 40 and figure["statuses"] == {"OK": 40}
        assert figure["malformed_answers"] == 0 and figure["dropped"] == 0 and figure["answered_ok"] == 40
    assert list(result["cpu_seconds"]) == ["in-process"]
    assert sorted(result["processes"]["cpu_seconds"]) == ["active", "client", "coordinator", "passive-1"]
    cpu = result["processes"]["cpu_seconds"].values()  # /proc counts in ticks (10 ms): a light process may read 0
    assert all(seconds >= 0 for seconds in cpu) and sum(cpu) > 0
    assert [line.split(":")[0] for line in lines if "Predict requests" in line] == ["in-process", "processes"]
