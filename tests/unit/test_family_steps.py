"""A newcomer's family plugs its own messages into an engine without editing it (issue 11, review M4): it declares
its steps (ModelFamily.steps), and the coordinator's one ``family_call`` checks the caller against the declaration,
runs the step under the session lock with the engine's services, and checkpoints."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from vflsec.services.common import ACTIVE, COORDINATOR
from vflsec.services.crypto import he
from vflsec.services.defenses.release import ParamReleaseChain, ScoreReleaseChain
from vflsec.services.engines.checkpoint import StateDir
from vflsec.services.engines.coordinator import Coordinator
from vflsec.services.errors import FailedPrecondition, PermissionDenied
from vflsec.services.models import family as families

WIDTHS = {"active": 1, "passive-1": 1}
# The passive party's word on its aligned rows, which the coordinator asks before a first training step.
ALIGNED = {"passive-1": SimpleNamespace(aligned_rows=lambda session_id: 10_000)}


@dataclass
class CounterHolder:
    count: int = 0
    computed: int = 0  # how often a training step's answer was computed (a replay must not compute it again)
    share_width = 1

    def scores(self, aggregate: np.ndarray) -> np.ndarray:
        return np.hstack([1 - aggregate, aggregate])

    def released(self, call: families.ReleaseCall | None = None) -> dict[str, np.ndarray]:
        return {"count": np.array([self.count])}

    def to_state(self) -> families.State:
        return {}, {"counter": [self.count, self.computed]}


def _add(trainer: CounterHolder, ctx: families.KeyHolderContext, by: int) -> int:
    trainer.count += by
    return trainer.count


def _step(
    trainer: CounterHolder, ctx: families.KeyHolderContext, step: int, rows: np.ndarray
) -> families.StepAnswer:
    def compute(keys: he.Backend) -> families.StepAnswer:
        trainer.computed += 1
        return np.full((len(rows), 1), float(step)), float(trainer.computed)

    return ctx.train(step, rows, WIDTHS, he.MatrixLayout((len(rows), 1), 1, len(rows)), compute)


class CounterFamily:
    name = "counter-test"
    releases_passive_blocks = False
    steps: Mapping[str, Mapping[str, families.FamilyStep]] = {
        COORDINATOR: {
            "add": families.FamilyStep(_add, frozenset({ACTIVE})),
            "step": families.FamilyStep(_step, frozenset({ACTIVE}), checkpoint=False),
        }
    }

    def block_width(self, n_features: int, *, active: bool) -> int:
        return n_features

    def min_batch_size(self, widths: Iterable[int]) -> int:
        return 1

    def default_batch_size(self, widths: Iterable[int]) -> int:
        return 1

    def answers_per_step(self, widths: Iterable[int], n_classes: int) -> int:
        return 1

    def settings(self, values: Mapping[str, Any]) -> None:
        return None

    def new_key_holder(self, n_classes: int, passive_parties: Sequence[str], settings: Any) -> CounterHolder:
        return CounterHolder()

    def restore_key_holder(self, state: families.State) -> CounterHolder:
        return CounterHolder(*state[1]["counter"])


FAMILY = families.register(CounterFamily())  # type: ignore[arg-type]


def _coordinator(state: Path) -> Coordinator:
    chains = ScoreReleaseChain.from_specs(()), ParamReleaseChain.from_specs(())
    return Coordinator(*chains, ALIGNED, state=StateDir(state), allowed_backends=("plain",))


def test_a_declared_step_runs_for_its_callers_only_and_is_checkpointed(tmp_path: Path) -> None:
    c = _coordinator(tmp_path)
    c.open_session("s", "plain", 2, ["passive-1"], owner="active", family_name=FAMILY.name)
    c.open_session("lr", "plain", 2, ["passive-1"], owner="active")
    assert c.family_call("s", "active", "add", by=2) == 2
    assert c.family_call("s", "active", "add", by=3) == 5
    with pytest.raises(PermissionDenied, match="passive party may not call add"):
        c.family_call("s", "passive-1", "add", by=100)  # a party of the session, not a caller the step names
    with pytest.raises(PermissionDenied, match="active-2 is not a party"):
        c.family_call("s", "active-2", "add", by=100)
    with pytest.raises(FailedPrecondition, match="trains counter-test, which has no grow"):
        c.family_call("s", "active", "grow")
    with pytest.raises(FailedPrecondition, match="trains lr, which has no add"):
        c.family_call("lr", "active", "add", by=1)
    assert c.sessions["s"].trainer.count == 5
    assert _coordinator(tmp_path).sessions["s"].trainer.count == 5  # durable: a restart finds it


def test_a_family_training_step_is_admitted_replayed_and_ordered_by_the_engine(tmp_path: Path) -> None:
    c = _coordinator(tmp_path)
    c.open_session("s", "plain", 2, ["passive-1"], owner="active", family_name=FAMILY.name)
    rows = np.arange(4)
    gradient, loss = c.family_call("s", "active", "step", step=1, rows=rows)
    assert gradient.tolist() == [[1.0]] * 4 and loss == 1.0
    again, loss_again = c.family_call("s", "active", "step", step=1, rows=rows)  # a replay: the recorded answer
    assert np.array_equal(again, gradient) and loss_again == 1.0 and c.sessions["s"].trainer.computed == 1
    with pytest.raises(FailedPrecondition, match="computed for another batch"):
        c.family_call("s", "active", "step", step=1, rows=rows + 1)
    with pytest.raises(FailedPrecondition, match="does not follow the last step 1"):
        c.family_call("s", "active", "step", step=3, rows=rows)
    restarted = _coordinator(tmp_path)  # the engine's own checkpoint of the step (the step declares none)
    s = restarted.sessions["s"]
    assert s.last_step == 1 and s.trained_index.array().tolist() == [0, 1, 2, 3]
    replayed, _ = restarted.family_call("s", "active", "step", step=1, rows=rows)
    assert np.array_equal(replayed, gradient) and restarted.sessions["s"].trainer.computed == 1
