"""Rule 2 (docs/protocol.md, "The four rules every RPC follows"), as a new family would meet it: the coordinator
engine, not the family, charges every slot a family step decrypts to the key's budget of N/4 (he.KEY_BUDGET) and
refuses past it, before decrypting.

The probe family below declares that it answers one value per step (answers_per_step = 1, so its key epochs are
long) and then asks the engine's keys to decrypt more than a key's budget, in one step or over several steps of one
key epoch. Real CKKS keys; the engine is built directly (no gRPC: the rule is the engine's, whatever calls it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from vflsec.services.common import ACTIVE, COORDINATOR
from vflsec.services.crypto import he
from vflsec.services.defenses.release import ParamReleaseChain, ScoreReleaseChain
from vflsec.services.engines.checkpoint import StateDir
from vflsec.services.engines.coordinator import Coordinator
from vflsec.services.errors import ResourceExhausted
from vflsec.services.models import family as families

WIDTHS = {"active": 2, "passive-1": 2}
# The passive party's word on its aligned rows, which the coordinator asks before a first training step.
ALIGNED = {"passive-1": SimpleNamespace(aligned_rows=lambda session_id: 10_000)}


class _Trainer:
    share_width = 1

    def to_state(self) -> families.State:
        return {}, {}


def _decrypting(
    trainer: _Trainer, ctx: families.KeyHolderContext, step: int, matrices: list[he.EncryptedMatrix]
) -> Any:
    """A family step that decrypts ``matrices`` under the step's keys, as the engine lends them (metered)."""

    def compute(keys: families.MeteredKeys) -> families.StepAnswer:
        opened = [he.decrypt_matrix(keys, m) for m in matrices]  # type: ignore[arg-type]
        return np.concatenate(opened)[:, 0], 0.0

    rows = np.arange(matrices[0].shape[0])
    return ctx.train(step, rows, WIDTHS, matrices[0].layout, compute)


class _ProbeFamily:
    name = "budget-probe"
    releases_passive_blocks = False
    steps: Mapping[str, Mapping[str, families.FamilyStep]] = {
        COORDINATOR: {"decrypting": families.FamilyStep(_decrypting, frozenset({ACTIVE}), checkpoint=False)}
    }

    def block_width(self, n_features: int, *, active: bool) -> int:
        return n_features

    def min_batch_size(self, widths: Iterable[int]) -> int:
        return 1

    def answers_per_step(self, widths: Iterable[int], n_classes: int) -> int:
        return 1  # under-declared on purpose: the engine's count does not trust it

    def settings(self, values: Mapping[str, Any]) -> None:
        return None

    def new_key_holder(self, n_classes: int, passive_parties: Any, settings: Any) -> _Trainer:
        return _Trainer()


@pytest.fixture(scope="module")
def engine() -> Coordinator:
    families.register(_ProbeFamily())  # type: ignore[arg-type]
    chains = ScoreReleaseChain.from_specs([]), ParamReleaseChain.from_specs([])
    return Coordinator(*chains, ALIGNED, state=StateDir(None), schema=WIDTHS)


def _open(engine: Coordinator, sid: str) -> None:
    engine.open_session(sid, "ckks", 2, ["passive-1"], "active", family_name=_ProbeFamily.name)


def _call(engine: Coordinator, sid: str, step: int, *sizes: int, value: float = 0.0) -> families.StepAnswer:
    """The probe step asking the engine to decrypt one ciphertext of each size, under the step's keys."""
    _, _, context = engine.training_context(sid, "active", step)
    public = he.open_public("ckks", context)
    matrices = [he.encrypt_matrix(public, np.full((n, 1), value)) for n in sizes]
    return engine.family_call(sid, "active", "decrypting", step=step, matrices=matrices)


def test_a_family_step_decrypting_more_than_a_key_budget_is_refused_by_the_engine(engine, monkeypatch) -> None:
    opened: list[int] = []
    decrypt = he.CkksBackend._decrypt
    monkeypatch.setattr(he.CkksBackend, "_decrypt", lambda self, ct: opened.append(1) or decrypt(self, ct))
    _open(engine, "one-step")
    with pytest.raises(ResourceExhausted, match="decryption budget"):
        _call(engine, "one-step", 1, he.KEY_BUDGET + 1)  # one ciphertext of N/4 + 1 slots
    assert opened == []  # refused before anything was decrypted
    # A step within the budget is answered, and the engine, not the family, has counted it.
    answer, _ = _call(engine, "one-step", 1, he.KEY_BUDGET, value=1.0)
    np.testing.assert_allclose(answer, 1.0, atol=1e-3)
    assert engine.session("one-step").spent == {0: he.KEY_BUDGET}


def test_slots_add_up_over_the_steps_of_one_key_epoch(engine) -> None:
    _open(engine, "many-steps")
    s = engine.session("many-steps")
    assert s.rotation == he.key_rotation_steps(1) == 2048  # long epochs on the family's word: the count refuses
    _call(engine, "many-steps", 1, he.KEY_BUDGET // 2)
    _call(engine, "many-steps", 2, he.KEY_BUDGET // 4, he.KEY_BUDGET // 4)  # two ciphertexts, counted alike
    with pytest.raises(ResourceExhausted, match=f"{he.KEY_BUDGET} of {he.KEY_BUDGET} slots"):
        _call(engine, "many-steps", 3, 1)
    assert s.spent == {0: he.KEY_BUDGET} and s.last_step == 2
