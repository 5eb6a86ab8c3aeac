"""What an attack run costs on the client side (issue 16, fast runs): the dataset is parsed once per process,
and the harness's throwaway federation writes no session checkpoints (fsync'd on every training step)."""

from __future__ import annotations

import pytest

from vflsec.client.experiments import harness
from vflsec.client.federation import launcher as federation
from vflsec.client.federation.launcher import FederationSpec
from vflsec.services.config import load_config
from vflsec.services.data import datasets


def test_an_attack_run_loads_its_dataset_once_and_deals_without_checkpoints(monkeypatch) -> None:
    federation._load_dataset.cache_clear()
    loads: list[str] = []
    real_load = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda name, **kw: loads.append(name) or real_load(name, **kw))
    layouts: list[federation.FederationLayout] = []
    real_run = harness.run_scenario

    def spied(scenario: harness.AttackScenario, workdir, *progress):  # type: ignore[no-untyped-def]
        run = real_run(scenario, workdir, *progress)
        layouts.append(run.layout)
        assert all(load_config(path).state_dir is None for path in run.layout.configs.values())
        assert not any((path.parent / "state").exists() for path in run.layout.configs.values())
        return run

    monkeypatch.setattr(harness, "run_scenario", spied)
    spec = FederationSpec("breast_cancer", backend="plain", epochs=2)
    report = harness.run_attack_scenario(harness.AttackScenario(spec, attacks=("esa",), predictions=60,
                                                                in_process=True))  # fmt: skip
    assert loads == ["breast_cancer"] and len(layouts) == 1 and report["n_samples"] == 60
    assert spec.checkpoints  # the caller's spec is unchanged: only the temporary federation goes without


def test_the_shared_dataset_is_read_only_and_keyed_by_encoding() -> None:
    onehot, again = FederationSpec("breast_cancer").data, FederationSpec("breast_cancer", seed=3).data
    assert onehot is again
    with pytest.raises(ValueError, match="read-only"):
        onehot.X[0, 0] = 1.0
    target = FederationSpec("breast_cancer", encoding="target").data  # loaded with codes ("ordinal")
    assert target is not onehot and target is FederationSpec("breast_cancer", encoding="ordinal").data
