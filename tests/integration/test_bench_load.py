"""The load benchmark answers every concurrent request completely (timings are printed, never asserted)."""

from __future__ import annotations

from vflsec.client import bench_load


def test_no_request_is_dropped_under_concurrency() -> None:
    lines: list[str] = []
    result = bench_load.run(n_requests=50, concurrency=8, samples_per_request=3, epochs=1, log=lines.append)
    assert result["requests"] == 50
    assert result["statuses"] == {"OK": 50}
    assert result["malformed_answers"] == 0 and result["dropped"] == 0 and result["answered_ok"] == 50
    assert 0 < result["latency_ms"]["p50"] <= result["latency_ms"]["p99"] <= result["latency_ms"]["max"]
    assert any("dropped 0" in line for line in lines)
