"""SecretFlow's PSI (the `spu` wheel's libpsi) on this machine, behind docs/performance.md's spu section.

Two parties over brpc on loopback, optionally with mutual TLS from a CA made here; IDs as `vflsec bench align` has
them (80 % common). Needs its own environment: `spu` 0.9.5 pins numpy<2 and Python<3.12, so it cannot share vflsec's.

    python3.11 -m venv /tmp/spuenv && /tmp/spuenv/bin/pip install spu==0.9.5
    /tmp/spuenv/bin/python benchmarks/psi_spu_eval.py 1000000 PROTOCOL_RR22 ssl   # or PROTOCOL_ECDH

Prints one JSON line: wall seconds, each party's seconds and peak RSS, the load average.
"""

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from multiprocessing import Process, Queue

import spu.libspu.link as link
import spu.psi as psi

OVERLAP = 0.8


def write_ids(path: str, rank: int, rows: int) -> None:
    common = round(OVERLAP * rows)
    with open(path, "w") as f:
        f.write("id\n")
        for i in range(rows if rank == 0 else common):
            f.write(f"{i:012d}\n")
        if rank:
            for i in range(rows - common):
                f.write(f"p-{i:012d}\n")


def make_certificates(folder: str) -> None:
    """A CA and one certificate per party (P-256), as vflsec's own CA issues them."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=ca", "-days", "1")
    for r in (0, 1):
        openssl("req", *ec, "-keyout", f"p{r}.key", "-out", f"p{r}.csr", "-subj", f"/CN=p{r}")
        openssl("x509", "-req", "-in", f"p{r}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"p{r}.crt", "-days", "1")  # fmt: skip


def party(rank: int, protocol: str, tls: bool, folder: str, q: Queue) -> None:
    desc = link.Desc()
    desc.id = "psi"
    desc.recv_timeout_ms = 3600 * 1000
    desc.add_party("alice", "127.0.0.1:61301")
    desc.add_party("bob", "127.0.0.1:61302")
    if tls:
        desc.enable_ssl = True
        for opts in (desc.client_ssl_opts, desc.server_ssl_opts):
            opts.cert.certificate_path = f"{folder}/p{rank}.crt"
            opts.cert.private_key_path = f"{folder}/p{rank}.key"
            opts.verify.ca_file_path = f"{folder}/ca.crt"
            opts.verify.verify_depth = 1
    ctx = link.create_brpc(desc, rank)
    conf = psi.PsiExecuteConfig(
        protocol_conf=psi.PsiProtocolConfig(
            protocol=psi.parse_protocol(protocol), receiver_rank=0, broadcast_result=False,
            ecdh_params=psi.EcdhParams(curve=psi.EllipticCurveType.CURVE_25519),
        ),
        input_params=psi.InputParams(path=f"{folder}/in{rank}.csv", selected_keys=["id"], keys_unique=True),
        output_params=psi.OutputParams(path=f"{folder}/out{rank}.csv", disable_alignment=True),
    )
    t0 = time.perf_counter()
    report = psi.psi_execute(conf, ctx)
    q.put({"rank": rank, "seconds": time.perf_counter() - t0, "intersection": report.intersection_count,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})  # fmt: skip
    ctx.stop_link()


def main() -> None:
    rows, protocol, tls = int(sys.argv[1]), sys.argv[2], len(sys.argv) > 3
    folder = tempfile.mkdtemp()
    for r in (0, 1):
        write_ids(f"{folder}/in{r}.csv", r, rows)
    if tls:
        make_certificates(folder)
    q: Queue = Queue()
    t0 = time.perf_counter()
    procs = [Process(target=party, args=(r, protocol, tls, folder, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    out = [q.get() for _ in procs]
    for p in procs:
        p.join()
    print(json.dumps({"rows": rows, "protocol": protocol, "tls": tls, "wall_seconds": time.perf_counter() - t0,
                      "parties": sorted(out, key=lambda o: o["rank"]), "load": os.getloadavg()[0]}))  # fmt: skip


if __name__ == "__main__":
    main()
