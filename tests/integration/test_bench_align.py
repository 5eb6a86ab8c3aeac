"""`vflsec bench align`: the known common set comes back exactly, with every figure the JSON promises
(timings are reported, never asserted)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from vflsec.client.bench.align import op_counts, party_ids
from vflsec.client.cli import app


def test_ids_overlap_ninety_percent_and_ops_count_the_protocol() -> None:
    active, passive = set(party_ids("active", 1000)), list(party_ids("passive-1", 1000))
    assert len(passive) == len(set(passive)) == 1000 and len(active & set(passive)) == 900
    # A: n hashes + n mults; each P: n + n mults, n hashes; A: n mults per P.
    assert op_counts(1000, 1) == {"hash_to_group": 2000, "scalar_mult": 4000}
    assert op_counts(1000, 2) == {"hash_to_group": 3000, "scalar_mult": 7000}


@pytest.mark.parametrize("transport", ["grpc", "pipes"])
def test_bench_align_json_reports_the_figures_for_two_passive_parties(transport: str) -> None:
    # grpc: every party a `vflsec serve` process, the shipped streamed exchange; 3,000 ids make 2 chunks a list.
    # Both protocols, OPRF first: its figures on top, each protocol's under "runs".
    rows = 3000
    args = ["bench", "align", "--rows", str(rows), "--passive", "2", "--transport", transport, "--protocol", "both"]
    out = CliRunner().invoke(app, [*args, "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["protocol"] == "both" and list(result["runs"]) == ["oprf", "ecdh"]
    assert result["default_protocol"] == "oprf"  # the shipped default at both sides ([psi] protocol, accept)
    assert result["x25519_1m_seconds"] > 0 and result["x25519_1m_cpu_seconds"] > 0
    assert result["align_seconds"] == result["runs"]["oprf"]["align_seconds"]
    for protocol, run in result["runs"].items():
        assert run["protocol"] == protocol and run["transport"].startswith(transport)
        assert run["correct"] is True and run["common"] == 2700
        assert run["ratio_to_x25519_1m"] == run["align_seconds"] / result["x25519_1m_seconds"]
        assert run["cpu_ratio_to_x25519_1m"] == run["cpu_seconds"] / result["x25519_1m_cpu_seconds"]
        assert set(run["peak_rss_mb"]) == set(run["peak_pss_mb"]) == {"active", "passive-1", "passive-2"}
        assert all(mb > 0 for mb in run["peak_rss_mb"].values())
    ecdh = result["runs"]["ecdh"]
    assert set(ecdh["per_op_us"]) == set(ecdh["per_op_cpu_us"]) == {"hash_to_group", "scalar_mult"}
    assert ecdh["group"] == "ristretto255_XMD:SHA-512_R255MAP_RO_"
    assert ecdh["cpu_seconds"] > 0 and ecdh["cpu_ratio"] == ecdh["cpu_seconds"] / ecdh["cpu_floor_seconds"]
    assert ecdh["ratio_to_floor"] == ecdh["align_seconds"] / ecdh["floor_seconds"]
    assert "per_op_us" not in result["runs"]["oprf"]  # OPRF's floor is not curve work


def test_bench_align_refuses_too_few_rows_and_unknown_transports_or_protocols() -> None:
    out = CliRunner().invoke(app, ["bench", "align", "--rows", "5"])
    assert out.exit_code != 0 and "--rows" in out.output and "10" in out.output
    out = CliRunner().invoke(app, ["bench", "align", "--rows", "100", "--transport", "carrier-pigeon"])
    assert out.exit_code != 0 and "--transport must be one of grpc, pipes" in out.output
    out = CliRunner().invoke(app, ["bench", "align", "--rows", "100", "--protocol", "rsa"])
    assert out.exit_code == 2 and "--protocol must be one of oprf, ecdh, both, got 'rsa'" in out.output


def test_bench_align_keeps_parties_as_a_hidden_alias_of_passive() -> None:
    """--passive as the other commands name it; --parties, its first name, still works for scripts, unlisted."""
    help_text = CliRunner().invoke(app, ["bench", "align", "--help"]).output
    assert "--passive" in help_text and "--parties" not in help_text
    args = ["bench", "align", "--rows", "100", "--transport", "pipes", "--json"]
    out = CliRunner().invoke(app, [*args, "--parties", "2"])
    assert out.exit_code == 0, out.output
    assert set(json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mb"]) == {"active", "passive-1", "passive-2"}
    out = CliRunner().invoke(app, [*args, "--passive", "3", "--parties", "2"])
    assert out.exit_code == 2 and "--parties is the old name of --passive" in out.output


def test_above_the_default_cap_the_bench_lets_its_own_parties_take_its_list(monkeypatch, tmp_path) -> None:
    # The bench deploys every party: a --rows above [limits] psi_max_ids raises the cap (and the owner budget) in the
    # configs it writes, so `--rows 10000000` runs; at or below the cap the configs keep the deployment defaults.
    import tomllib

    from vflsec.client.bench import align
    from vflsec.services.crypto import oprf, psi

    monkeypatch.setattr(psi, "MAX_IDS", 150)
    layout = align.write_align_federation(200, 1, tmp_path / "above")
    for party in ("active", *layout.passive_parties):
        config = tomllib.loads((tmp_path / "above" / party / "config.toml").read_text())
        assert config["limits"] == {"psi_max_ids": 200, "psi_owner_budget": 10 * oprf.bins(200)}
    layout = align.write_align_federation(150, 1, tmp_path / "at")
    assert "limits" not in tomllib.loads((tmp_path / "at" / "active" / "config.toml").read_text())


def test_a_refused_alignment_is_one_line_naming_the_partys_reason(monkeypatch) -> None:
    import grpc

    from vflsec.client.bench import align

    class Refused(grpc.RpcError):  # what the operator's AlignStream raises when a party refuses
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.FAILED_PRECONDITION

        def details(self) -> str:
            return "PSI: this party holds 3000 sample IDs, over the cap of 2000 ([limits] psi_max_ids)"

    def refuse(*args, **kwargs):
        raise Refused()

    monkeypatch.setattr(align, "run", refuse)
    out = CliRunner().invoke(app, ["bench", "align", "--rows", "3000", "--json"])
    assert out.exit_code == 2 and len(out.output.strip().splitlines()) == 1, out.output
    assert out.output.strip() == (
        "error: the alignment was refused: FAILED_PRECONDITION: PSI: this party holds 3000 sample IDs, over the cap of "
        "2000 ([limits] psi_max_ids)"
    )
