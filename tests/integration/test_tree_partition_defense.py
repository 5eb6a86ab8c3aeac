"""Tree partition defenses through the real services (in-process parties, gRPC over loopback, mTLS, CKKS, PSI): the
curious passive party's own store (services/plugins/curious.py, what `vflsec attack --attacker passive-1` attacks)
holds no node of a tree or level the session's defense hides, while the same federation undefended shows it them;
bad specs are refused over the wire and on the CLI, naming the field."""

from __future__ import annotations

import grpc
import pytest
from typer.testing import CliRunner

from tests.integration.conftest import curious_wine
from vflsec.client.cli import app
from vflsec.client.experiments import runs
from vflsec.services import plugins
from vflsec.services.models.tree.steps import node_depth
from vflsec.services.plugins.curious import ObservationStore


@pytest.fixture(scope="module")
def curious_passive(tmp_path_factory):
    """wine dealt so that passive-1 holds 10 of 13 columns (it wins splits), with the curious store at passive-1."""
    with curious_wine(tmp_path_factory.mktemp("partition-defense")) as (fed, store):
        yield fed, store


def _seen(fed, store, family: str, settings: dict) -> tuple[set, set, dict]:
    """Grow a session; the (tree, node) keys whose rows the passive party recorded (nodes it was asked products for,
    and nodes it split), and the settings it joined with."""
    sid = fed.operator.create_session("ckks", family=family, settings=settings, seed=0).session_id
    common = sorted(fed.operator.align(sid))
    assert list(fed.operator.train(sid, common[:120], 1))[-1].done
    recorded = ObservationStore(store)
    searched = {(r.meta["tree"], r.meta["node_id"]) for r in recorded.read(sid, plugins.NODE_ROWS)}
    split = {(r.meta["tree"], r.meta["node_id"]) for r in recorded.read(sid, plugins.OWN_SPLIT)}
    joined = next(recorded.read(sid, plugins.SESSION)).meta
    return searched, split, joined


def test_a_curious_passive_party_records_no_node_of_a_hidden_tree(curious_passive) -> None:
    fed, store = curious_passive
    forest = {"n_trees": 4, "max_depth": 2}
    searched, split, _ = _seen(fed, store, "forest", forest)
    assert any(t < 2 for t, _ in searched)  # undefended, it is shown nodes of the first two trees
    searched, split, joined = _seen(fed, store, "forest", {**forest, "partition_defense": ["complete_secure:trees=2"]})
    assert searched and not any(t < 2 for t, _ in searched | split)  # none of theirs; still nodes of the others
    assert joined["settings"]["partition_defense"] == ["complete_secure:trees=2"]  # the mechanism is public to it


def test_a_curious_passive_party_records_no_node_below_the_passive_depth(curious_passive) -> None:
    fed, store = curious_passive
    searched, _, _ = _seen(fed, store, "tree", {"max_depth": 4})
    assert any(node_depth(i) >= 1 for _, i in searched)  # undefended, it is shown the root's children and below
    searched, split, _ = _seen(fed, store, "tree", {"max_depth": 4, "partition_defense": ["passive_depth:depth=1"]})
    assert searched == {(0, 0)} and split <= {(0, 0)}  # the root's rows (every training row) and nothing below


def test_bad_partition_defenses_are_refused_over_the_wire_and_on_the_cli(curious_passive, monkeypatch) -> None:
    fed, _ = curious_passive
    for settings, named in (
        ({"partition_defense": ["hide"]}, "unknown partition defense step 'hide'"),
        ({"partition_defense": ["complete_secure:trees=0"]}, "trees must be an integer >= 1"),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            fed.operator.create_session("ckks", family="tree", settings=settings)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert named in refused.value.details() and "partition_defense" in refused.value.details()
    monkeypatch.setattr(runs, "run_processes", runs.run_in_process)
    for args, named in (
        (["--model", "tree", "--partition-defense", "hide"], "partition defense step 'hide'"),
        (["--model", "lr", "--partition-defense", "complete_secure"], "--model tree or forest only"),
    ):
        out = CliRunner().invoke(app, ["attack", "--attacker", "passive-1", "--json", *args])
        errors = [line for line in out.output.splitlines() if not line.startswith("note:")]  # notes say defaults
        assert out.exit_code == 2 and len(errors) == 1 and named in errors[0], out.output
