"""The PSI size caps: [limits] psi_max_ratio (relative to the receiving party's own set) and psi_max_ids
(absolute); a refusal names the bound and the smallest value that accepts the list; the chunk reader takes no
memory for a list its caps refuse."""

from __future__ import annotations

from pathlib import Path

import pytest

from vflsec.services.config import ConfigError, parse_config
from vflsec.services.crypto import psi

_RAW = {
    "role": "passive",
    "party_id": "passive-1",
    "listen": "127.0.0.1:0",
    "tls": {"ca": "ca.pem", "cert": "cert.pem", "key": "key.pem"},
    "data": {"path": "data.csv"},
}


def test_defaults_pass_a_million_row_partner_of_equal_size_and_a_ninety_percent_overlap() -> None:
    psi.Caps().check(1_000_000, 1_000_000)
    psi.Caps().check(1_000_000, 900_000)
    psi.Caps().check(2 * 540, 540)
    psi.Caps().check(1_000_000, 10_000)  # the floor: a million-row partner is never refused by default


def test_the_ratio_binds_above_its_floor() -> None:
    psi.Caps().check(1_000_001, 500_001)
    with pytest.raises(ValueError, match="psi_ratio_floor = 1000000 always pass"):
        psi.Caps().check(1_000_001, 500_000)


def test_refusals_name_the_bound_and_the_smallest_accepted_value() -> None:
    with pytest.raises(ValueError, match=r"1081 IDs announced, over 2 x this party's own 540 IDs "
                       r"\(\[limits\] psi_max_ratio; the smallest that accepts them is 2.01;"):
        psi.Caps(ratio_floor=0).check(1081, 540)
    with pytest.raises(ValueError, match=r"over this party's cap of 100 \(\[limits\] psi_max_ids; the smallest "
                       r"that accepts them is 101\)"):
        psi.Caps(max_ids=100).check(101, 1000)
    psi.Caps(max_ratio=2.01, ratio_floor=0).check(1081, 540)  # the value the message names does accept it


def test_reader_refuses_the_announced_size_before_taking_memory_for_it() -> None:
    reader = psi.ChunkReader(psi.Caps(ratio_floor=0).checker(10))
    with pytest.raises(ValueError, match="psi_max_ratio"):
        reader.add(psi.Chunk(0, 200, 1_500_000, bytes(32)))  # 48 MB, were it taken
    assert reader.result().size == 0


def test_config_reads_psi_max_ratio_and_refuses_a_non_positive_one(tmp_path: Path) -> None:
    assert parse_config(_RAW, base=tmp_path).psi_max_ratio == psi.MAX_RATIO
    assert parse_config({**_RAW, "limits": {"psi_max_ratio": 1.25}}, base=tmp_path).psi_max_ratio == 1.25
    with pytest.raises(ConfigError, match=r"\[limits\] psi_max_ratio must be > 0, got 0.0"):
        parse_config({**_RAW, "limits": {"psi_max_ratio": 0}}, base=tmp_path)


def test_config_reads_the_psi_protocol_default_oprf_and_refuses_another(tmp_path: Path) -> None:
    assert parse_config(_RAW, base=tmp_path).psi_protocol == "oprf"
    assert parse_config({**_RAW, "psi": {"protocol": "ecdh"}}, base=tmp_path).psi_protocol == "ecdh"
    with pytest.raises(ConfigError, match=r"\[psi\] protocol must be one of oprf, ecdh, got 'rsa'"):
        parse_config({**_RAW, "psi": {"protocol": "rsa"}}, base=tmp_path)


def test_config_reads_psi_accept_default_both_and_refuses_a_bad_list(tmp_path: Path) -> None:
    assert set(parse_config(_RAW, base=tmp_path).psi_accept) == {"ecdh", "oprf"}
    assert parse_config({**_RAW, "psi": {"accept": ["ecdh"]}}, base=tmp_path).psi_accept == ("ecdh",)
    for bad in ("oprf", [], ["rsa"], [1]):
        with pytest.raises(ConfigError, match=r"\[psi\] accept must be a non-empty list of oprf, ecdh, got "):
            parse_config({**_RAW, "psi": {"accept": bad}}, base=tmp_path)
