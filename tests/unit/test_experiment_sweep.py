"""Sweep expansion: cells, their release chains, and which cells share one trained federation."""

from __future__ import annotations

from pathlib import Path

from vflsec.client.experiments import scenario as exp_scenario


def scenario(tmp_path: Path, text: str) -> exp_scenario.Scenario:
    path = tmp_path / "s.yaml"
    path.write_text("dataset: wine\nbackend: plain\n" + text)
    return exp_scenario.load_scenario(path)


def test_cartesian_product_with_repetitions_and_undefended_rows_first(tmp_path: Path) -> None:
    s = scenario(tmp_path, "repetitions: 2\nsweep:\n  passive_fraction: [0.3, 0.6]\n  rounding.decimals: [1, 2]\n")
    cells = exp_scenario.expand(s)
    assert len(cells) == (2 * 2 + 2) * 2  # 4 defended points + one undefended per fraction, x 2 repetitions
    assert [c.values for c in cells[:4:2]] == [
        (("passive_fraction", 0.3), ("rounding.decimals", None)),
        (("passive_fraction", 0.6), ("rounding.decimals", None)),
    ]
    assert {c.repetition for c in cells} == {0, 1}
    assert len({exp_scenario.cell_key(s, c) for c in cells}) == len(cells)


def test_no_baseline_and_no_sweep(tmp_path: Path) -> None:
    assert len(exp_scenario.expand(scenario(tmp_path, "baseline: false\nsweep:\n  rounding.decimals: [1, 2]\n"))) == 2
    (only,) = exp_scenario.expand(scenario(tmp_path, "release: [rounding:decimals=2]\n"))
    assert only.values == () and exp_scenario.chains(scenario(tmp_path, "release: [rounding:decimals=2]\n"), only) == (
        ("rounding:decimals=2",),
        (),
    )


def test_chains_set_a_swept_parameter_or_append_the_step(tmp_path: Path) -> None:
    s = scenario(
        tmp_path,
        "release: ['privee:epsilon=0.5,preset=rank_safe', 'rounding:decimals=3']\n"
        "sweep:\n  privee.epsilon: [0.1]\n  varasteh.epsilon: [0.01]\n",
    )
    defended = next(c for c in exp_scenario.expand(s) if c.values[0][1] is not None)
    score, param = exp_scenario.chains(s, defended)
    assert score == ("privee:epsilon=0.1,preset=rank_safe", "rounding:decimals=3")
    assert param == ("varasteh:epsilon=0.01",)
    undefended = next(c for c in exp_scenario.expand(s) if c.values[0][1] is None)
    assert exp_scenario.chains(s, undefended) == ((), ())  # the reference row drops the file's chains too


def test_repetitions_vary_the_seed_and_the_fraction_the_split(tmp_path: Path) -> None:
    s = scenario(tmp_path, "seed: 5\nrepetitions: 2\nsweep:\n  passive_fraction: [0.25]\n")
    first, second = exp_scenario.expand(s)
    assert (exp_scenario.cell_spec(s, first).seed, exp_scenario.cell_spec(s, second).seed) == (5, 6)
    assert exp_scenario.cell_spec(s, first).passive_features == 0.25


def test_training_groups_share_everything_but_the_release(tmp_path: Path) -> None:
    s = scenario(tmp_path, "repetitions: 2\nsweep:\n  passive_fraction: [0.3, 0.6]\n  privee.epsilon: [0.1, 0.5]\n")
    cells = exp_scenario.expand(s)
    groups: dict[str, set] = {}
    for c in cells:
        key = exp_scenario.training_key(s, c)
        groups.setdefault(key, set()).add((dict(c.values)["passive_fraction"], c.repetition))
    assert len(groups) == 4  # (fraction, repetition): 3 release settings each share one trained federation
    assert all(len(members) == 1 for members in groups.values())
    # The attacks change a cell's result, not its training.
    other = scenario(tmp_path, "repetitions: 2\nattacks: [esa]\nsweep:\n  passive_fraction: [0.3, 0.6]\n"
                     "  privee.epsilon: [0.1, 0.5]\n")  # fmt: skip
    assert exp_scenario.training_key(other, cells[0]) == exp_scenario.training_key(s, cells[0])
    assert exp_scenario.cell_key(other, cells[0]) != exp_scenario.cell_key(s, cells[0])
