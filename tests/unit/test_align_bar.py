"""The demo's and the attack's alignment bar follows the active party's counts (client/federation/demo.py ``align``)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from vflsec.client.federation.demo import Phases, align


class _Operator:
    def align(self, session_id: str, progress: Callable[[int, int, str], None]) -> list[str]:
        for done, total, stage in ((0, 400, "blinding"), (100, 400, "blinding"), (250, 400, "exchanging"),
                                   (400, 400, "finishing")):  # fmt: skip
            progress(done, total, stage)
        return ["a", "b"]


def test_the_align_bar_advances_by_each_new_count_towards_the_reported_total() -> None:
    calls: list[tuple[int, int | None]] = []

    @contextlib.contextmanager
    def bar(what: str, total: int | None) -> Iterator[Callable[..., None]]:
        calls.append((-1, total))  # opened without a total: the active party reports it
        yield lambda n, total=None: calls.append((n, total))

    phases = Phases(bar=bar)
    assert align(_Operator(), "s", phases, "aligning") == ["a", "b"]  # type: ignore[arg-type]
    assert calls == [(-1, None), (0, 400), (100, 400), (150, 400), (150, 400)]
    assert "align" in phases.seconds
