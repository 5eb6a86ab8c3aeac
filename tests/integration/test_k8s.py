"""deploy/k8s/ cannot be applied here (no cluster, no kubectl): render each overlay with a renderer of exactly the
kustomize subset the overlays use, validate every object against the schemas of stated Kubernetes versions
(kubernetes-validate, strict), check the manifests agree with the code, docker-compose.yml, the Dockerfile and the
docs, then run a party's container command and its probe as local processes."""

from __future__ import annotations

import copy
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from vflsec.services.config import dump_toml, parse_config
from vflsec.services.transport.tls import TlsFiles, make_pki

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = ("coordinator", "active", "passive")
# The oldest and the newest Kubernetes release whose schemas kubernetes-validate bundles that we support.
K8S_VERSIONS = ("1.33.0", "1.37.0")
# The kustomize subset the overlays may use, and so the renderer below implements.
KUSTOMIZATION_KEYS = {
    "apiVersion", "kind", "namespace", "resources", "configMapGenerator", "generatorOptions", "patches"
}


def _apply_json_patch(doc: dict, op: dict) -> None:
    """RFC 6902 `add` and `replace` (all the overlays use)."""
    assert op["op"] in ("add", "replace"), op
    *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].removeprefix("/").split("/")]
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        if last == "-":
            assert op["op"] == "add"
            node.append(op["value"])
        elif op["op"] == "add":
            node.insert(int(last), op["value"])
        else:
            node[int(last)] = op["value"]
    else:
        assert op["op"] == "add" or last in node, f"replace of a missing {op['path']}"
        node[last] = op["value"]


def render(folder: Path) -> list[dict]:
    """What `kubectl kustomize FOLDER` prints, for the subset in KUSTOMIZATION_KEYS."""
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())
    assert set(k) <= KUSTOMIZATION_KEYS, f"{folder}: the renderer does not implement {set(k) - KUSTOMIZATION_KEYS}"
    docs: list[dict] = []
    for resource in k.get("resources", []):
        path = (folder / resource).resolve()
        docs += render(path) if path.is_dir() else [d for d in yaml.safe_load_all(path.read_text()) if d]
    for gen in k.get("configMapGenerator", []):
        # A fixed name: no hash suffix, so no references to rewrite.
        assert set(gen) == {"name", "files"} and k["generatorOptions"] == {"disableNameSuffixHash": True}
        data = {Path(f).name: (folder / f).read_text() for f in gen["files"]}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data})
    for patch in k.get("patches", []):
        assert set(patch) == {"target", "patch"} and set(patch["target"]) == {"kind", "name"}
        target = [d for d in docs if {"kind": d["kind"], "name": d["metadata"]["name"]} == patch["target"]]
        assert len(target) == 1, patch["target"]
        for op in yaml.safe_load(patch["patch"]):
            _apply_json_patch(target[0], op)
    if "namespace" in k:
        for doc in docs:
            doc["metadata"]["namespace"] = k["namespace"]
    return docs


def _one(docs: list[dict], kind: str) -> dict:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {overlay: render(K8S / "overlays" / overlay) for overlay in OVERLAYS}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _pod(docs: list[dict]) -> tuple[dict, dict]:
    spec = _one(docs, "StatefulSet")["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    return spec, container


def _config(docs: list[dict]):
    _, container = _pod(docs)
    args = container["args"]
    path = Path(args[args.index("--config") + 1])
    text = _one(docs, "ConfigMap")["data"][path.name]
    return parse_config(tomllib.loads(text), base=path.parent, role=args[1], source=str(path)), path


def _mounts(docs: list[dict]) -> dict[str, dict]:
    """mountPath -> {"mount": the volumeMount, "volume": its volume (None: a volumeClaimTemplate)}."""
    sts = _one(docs, "StatefulSet")
    spec, container = _pod(docs)
    volumes = {v["name"]: v for v in spec["volumes"]}
    claims = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", [])}
    out = {}
    for m in container["volumeMounts"]:
        assert (m["name"] in volumes) != (m["name"] in claims), m
        out[m["mountPath"]] = {"mount": m, "volume": volumes.get(m["name"])}
    return out


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schema(rendered, version) -> None:
    for overlay, docs in rendered.items():
        for doc in docs:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{overlay}: {doc['kind']}/{doc['metadata']['name']} on Kubernetes {version}: {exc}")


def test_no_secret_material_in_the_repository(rendered) -> None:
    for overlay, docs in rendered.items():
        assert not [d for d in docs if d["kind"] == "Secret"], overlay
        spec, _ = _pod(docs)
        (tls,) = [v for v in spec["volumes"] if "secret" in v]
        # Referenced by name; every key of the Secret becomes a file (no `items` renaming them).
        assert tls["secret"] == {"secretName": "vflsec-tls", "defaultMode": 0o440}
    for path in K8S.rglob("*"):
        if path.is_file():
            assert "PRIVATE KEY" not in path.read_text() and "CERTIFICATE" not in path.read_text(), path


def test_each_overlay_is_one_party_in_its_own_namespace(rendered, compose) -> None:
    for overlay, docs in rendered.items():
        config, config_path = _config(docs)
        assert config.role == overlay
        # The party's id names its namespace: the passive overlay serves passive-N by changing both.
        assert {d["metadata"]["namespace"] for d in docs} == {f"vflsec-{config.party_id}"}
        _, container = _pod(docs)
        # compose's command for this role, with the config at the ConfigMap's mount.
        service = compose["services"]["passive-1" if overlay == "passive" else overlay]
        assert container["args"] == [*service["command"][:3], str(config_path)]
        peers = set(config.peers)
        if overlay == "coordinator":
            assert peers == set(config.schema) - {"active"} and all(p.startswith("passive-") for p in peers)
        elif overlay == "active":
            assert "coordinator" in peers and len(peers) >= 2
        else:
            assert peers == {"coordinator"}


def test_ports_mounts_and_probe_agree_with_the_config(rendered) -> None:
    for overlay, docs in rendered.items():
        config, config_path = _config(docs)
        _, container = _pod(docs)
        mounts = _mounts(docs)
        # The config comes from the ConfigMap, mounted read-only.
        assert mounts[str(config_path.parent)]["volume"]["configMap"]["name"] == _one(docs, "ConfigMap")["metadata"][
            "name"
        ]
        # TLS: the Secret's mount holds the tls/ layout every vflsec command reads (ca.pem, cert.pem, key.pem).
        tls_mount = mounts[str(config.tls.ca.parent)]
        assert "secret" in tls_mount["volume"]
        assert TlsFiles(config.tls.ca, config.tls.cert, config.tls.key) == TlsFiles.from_dir(config.tls.ca.parent)
        # State: the StatefulSet's own persistent volume, writable.
        assert mounts[str(config.state_dir)]["volume"] is None and not mounts[str(config.state_dir)]["mount"].get(
            "readOnly"
        )
        # Data: a claim the overlay declares, read-only; the coordinator holds none.
        if overlay == "coordinator":
            assert config.data is None and "/data" not in mounts
        else:
            data = mounts[str(config.data.path.parent)]
            claim = data["volume"]["persistentVolumeClaim"]["claimName"]
            assert data["mount"]["readOnly"] and _one(docs, "PersistentVolumeClaim")["metadata"]["name"] == claim
        # Only /state and the scratch /tmp are writable; HOME points at the scratch volume.
        writable = {p for p, m in mounts.items() if not m["mount"].get("readOnly")}
        assert writable == {str(config.state_dir), "/tmp"} and "emptyDir" in mounts["/tmp"]["volume"]
        assert {"name": "HOME", "value": "/tmp"} in container["env"]
        # One port: the config's listen port is the container's `grpc` port, which the Service forwards.
        port = int(config.listen.rsplit(":", 1)[1])
        assert config.listen.startswith("0.0.0.0:")
        assert container["ports"] == [{"name": "grpc", "containerPort": port, "protocol": "TCP"}]
        service = _one(docs, "Service")
        (service_port,) = service["spec"]["ports"]
        assert service_port["targetPort"] == "grpc" and service_port["port"] == port
        assert service["spec"]["selector"].items() <= _one(docs, "StatefulSet")["spec"]["template"]["metadata"][
            "labels"
        ].items()
        assert service["spec"]["loadBalancerSourceRanges"], "a party's port admits only its peers"
        # Peers are reached at the port every party's Service exposes.
        assert all(address.endswith(f":{port}") for address in config.peers.values())
        # Probes: `vflsec health` on the party's own config (the native grpc probe cannot speak mTLS).
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container[probe]["exec"]["command"] == ["vflsec", "health", "--config", str(config_path)]


def test_image_user_and_security_context_agree_with_compose_and_the_dockerfile(rendered, compose) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    uid = int(re.search(r"useradd .*--uid (\d+)", dockerfile)[1])
    entrypoint = yaml.safe_load(re.search(r"^ENTRYPOINT (.*)$", dockerfile, re.M)[1])
    for overlay, docs in rendered.items():
        spec, container = _pod(docs)
        assert container["image"] == compose["x-party"]["image"]
        assert container["startupProbe"]["exec"]["command"][0] == entrypoint[0]  # the image's `vflsec`
        assert spec["securityContext"]["runAsUser"] == uid and spec["securityContext"]["runAsNonRoot"] is True
        assert spec["automountServiceAccountToken"] is False
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]}
        for kind in ("requests", "limits"):
            assert set(container["resources"][kind]) == {"cpu", "memory"}, overlay
        assert _one(docs, "StatefulSet")["spec"]["replicas"] == 1  # one party is one process


def test_docs_create_the_secret_with_the_keys_the_pod_reads(rendered) -> None:
    docs = (ROOT / "docs" / "deploy.md").read_text()
    command = re.search(r"create secret generic (\S+) \\\n\s+(.*)\n", docs)
    assert command[1] == "vflsec-tls"
    keys = re.findall(r"--from-file=([\w.]+)=", command[2])
    config, _ = _config(rendered["passive"])
    assert sorted(keys) == sorted(p.name for p in (config.tls.ca, config.tls.cert, config.tls.key))


@pytest.mark.skipif(not (shutil.which("kubectl") or shutil.which("kustomize")), reason="no kubectl/kustomize here")
def test_the_renderer_agrees_with_kustomize(rendered) -> None:
    tool = ["kubectl", "kustomize"] if shutil.which("kubectl") else ["kustomize", "build"]
    for overlay, docs in rendered.items():
        out = subprocess.run([*tool, str(K8S / "overlays" / overlay)], capture_output=True, text=True, check=True)
        key = lambda d: (d["kind"], d["metadata"]["name"])  # noqa: E731
        assert sorted(yaml.safe_load_all(out.stdout), key=key) == sorted(docs, key=key), overlay


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_container_command_and_its_probe_run(rendered, tmp_path) -> None:
    """The coordinator's pod as local processes: the Secret's files, the ConfigMap, its args and its probe.
    Only the mount paths become folders here, and the port a free one (other tests may hold 50051)."""
    docs = copy.deepcopy(rendered["coordinator"])
    config, config_path = _config(docs)
    _, container = _pod(docs)
    pki = make_pki(tmp_path / "pki", ["coordinator"])
    # `kubectl create secret generic vflsec-tls --from-file=ca.pem=... --from-file=cert.pem=... --from-file=key.pem=...`
    secret = tmp_path / "tls"
    secret.mkdir()
    files = pki.files("coordinator")
    for name, source in (("ca.pem", files.ca), ("cert.pem", files.cert), ("key.pem", files.key)):
        shutil.copy(source, secret / name)
    mounts = {str(config_path.parent): tmp_path / "config", str(config.tls.ca.parent): secret}
    raw = tomllib.loads(_one(docs, "ConfigMap")["data"][config_path.name])
    raw["listen"] = f"127.0.0.1:{_free_port()}"
    raw["tls"] = {k: str(secret / Path(v).name) for k, v in raw["tls"].items()}
    raw["state"]["dir"] = str(tmp_path / "state")
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / config_path.name).write_text(dump_toml(raw))

    def local(argv: list[str]) -> list[str]:
        for target, source in mounts.items():
            argv = [str(source / Path(a).relative_to(target)) if a.startswith(f"{target}/") else a for a in argv]
        return argv

    probe = [sys.executable, "-m", "vflsec.client.cli", *local(container["readinessProbe"]["exec"]["command"][1:])]
    assert subprocess.run(probe, capture_output=True).returncode != 0  # nothing serves yet: the probe fails
    server = subprocess.Popen([sys.executable, "-m", "vflsec.client.cli", *local(container["args"])])
    try:
        deadline = time.monotonic() + 60
        while (done := subprocess.run(probe, capture_output=True, text=True)).returncode != 0:
            assert server.poll() is None, "the party exited"
            assert time.monotonic() < deadline, done.stderr
            time.sleep(0.5)
        assert "coordinator at localhost:" in done.stdout and "SERVING" in done.stdout
    finally:
        server.terminate()
        try:
            server.wait(60)  # drain and checkpoint; generous for a loaded 2-core CI machine
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
            raise


def test_health_takes_either_a_config_or_all_three_options(tmp_path) -> None:
    from typer.testing import CliRunner

    from vflsec.client.cli import app

    config = K8S / "overlays" / "coordinator" / "config.toml"
    for args in (["--config", str(config), "--party", "coordinator"], ["--party", "coordinator"]):
        result = CliRunner().invoke(app, ["health", *args])
        assert result.exit_code == 2 and "--address, --party and --tls-dir" in result.output, result.output
    result = CliRunner().invoke(app, ["health", "--config", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2 and "config file not found" in result.output
    # The repository's config names the pod's /tls mount, which does not exist here (a Secret not mounted).
    result = CliRunner().invoke(app, ["health", "--config", str(config)])
    assert result.exit_code == 2 and "cannot read the TLS files" in result.output and "/tls/ca.pem" in result.output


def test_the_scratch_volume_holds_the_oprf_spill_of_10m_ids(rendered) -> None:
    """Review 19: the OPRF sender keeps row and value (4 + 16 bytes) of each of its 3 values per own ID on /tmp until
    sent, and its (ID, bin) slots during U, for each of the exchanges an owner may run at once; the receiver its bins
    and outputs and a passive party's values while it matches them. 256Mi held one sender's 4.4M IDs, and past the
    limit the kubelet evicts the pod mid-exchange (docs/performance.md runs 10M)."""
    from vflsec.services.crypto import oprf
    from vflsec.services.engines.passive import PSI_STREAMS_PER_OWNER

    n, units = 10_000_000, {"Mi": 1 << 20, "Gi": 1 << 30}
    sender = PSI_STREAMS_PER_OWNER * n * oprf.HASHES * (4 + oprf.VALUE_BYTES + oprf._SLOT.itemsize)
    receiver = oprf.bins(n) * (oprf._BIN.itemsize + 4 + oprf.VALUE_BYTES) + n * oprf.HASHES * (4 + oprf.VALUE_BYTES)
    for role, spill in (("passive", sender), ("active", receiver)):
        limit = _mounts(rendered[role])["/tmp"]["volume"]["emptyDir"]["sizeLimit"]
        assert int(limit[:-2]) * units[limit[-2:]] >= spill * 1.05, (role, limit)  # and a bucket or range beside it
