"""docs/authorization.md is generated from the ROLE_POLICY dicts and must stay in sync with them."""

from __future__ import annotations

from pathlib import Path

from vflsec.services.rpc import active, authz, coordinator, passive, splitnn, trees

DOC = Path(__file__).resolve().parents[2] / "docs" / "authorization.md"


def test_doc_is_in_sync_with_the_policies() -> None:
    regenerate = "regenerate: python -m vflsec.services.rpc.authz > " + str(DOC)
    assert DOC.read_text() == authz.render_markdown(), regenerate


def test_matrix_covers_every_rpc_and_matches_each_policy() -> None:
    rules = authz.rules()
    by_service: dict[str, dict[str, frozenset[str]]] = {}
    for rule in rules:
        by_service.setdefault(rule.service.name, {})[rule.method.name] = rule.allowed
    # Every policy entry names a real RPC (a typo would leave that RPC denied to all) and is rendered as is.
    for name, policy in (
        ("Coordinator", coordinator.ROLE_POLICY),
        ("Active", active.ROLE_POLICY),
        ("Passive", passive.ROLE_POLICY),
        ("SplitNnCoordinator", splitnn.COORDINATOR_POLICY),
        ("SplitNnPassive", splitnn.PASSIVE_POLICY),
        ("TreeCoordinator", trees.COORDINATOR_POLICY),
        ("TreePassive", trees.PASSIVE_POLICY),
    ):
        assert set(policy) <= set(by_service[name]), f"{name} policy names unknown RPCs"
        for method, roles in policy.items():
            assert by_service[name][method] == roles
    assert len(rules) == sum(len(service.methods) for service, _ in authz.SERVICES)
    assert len({rule.path for rule in rules}) == len(rules)


def test_rendered_cells_follow_the_rules() -> None:
    table = [line for line in authz.render_markdown().splitlines() if line.startswith("| ") and "RPC" not in line]
    assert len(table) == len(authz.rules())
    for line, rule in zip(table, authz.rules(), strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[:2] == [rule.service.name, rule.method.name]
        assert cells[2:] == ["allowed" if role in rule.allowed else "denied" for role in authz.ROLES]


def test_family_policies_are_the_families_declarations() -> None:
    """A family servicer's policy is written out (a party starts without loading the family) and must equal what the
    family declares of its steps (ModelFamily.steps), which the engines enforce again at every call: every declared
    step is served by exactly one RPC, every family RPC runs a declared step."""
    from vflsec.services.common import COORDINATOR, PASSIVE
    from vflsec.services.models import family as families

    served = [
        ("splitnn", COORDINATOR, splitnn.COORDINATOR_STEPS, splitnn.COORDINATOR_POLICY),
        ("splitnn", PASSIVE, splitnn.PASSIVE_STEPS, splitnn.PASSIVE_POLICY),
        ("tree", COORDINATOR, trees.COORDINATOR_STEPS, trees.COORDINATOR_POLICY),
        ("tree", PASSIVE, trees.PASSIVE_STEPS, trees.PASSIVE_POLICY),
        ("lr", COORDINATOR, coordinator.LR_STEPS, coordinator.ROLE_POLICY),  # LR's steps in the generic services
        ("lr", PASSIVE, passive.LR_STEPS, passive.ROLE_POLICY),
    ]
    for family, host, methods, policy in served:
        declared = families.get(family).steps[host]
        assert sorted(methods.values()) == sorted(declared), (family, host)
        for rpc, step in methods.items():
            assert policy[rpc] == declared[step].callers, (family, host, rpc)
    assert families.get("forest").steps == families.get("tree").steps  # one service serves both
