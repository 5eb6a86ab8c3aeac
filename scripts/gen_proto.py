"""Generate the Python protobuf/gRPC modules beside the .proto files, or check they are in sync.

python scripts/gen_proto.py          # regenerate proto/vflsec/v1/*_pb2*.py(i)
python scripts/gen_proto.py --check  # exit 1 if the committed modules differ from a fresh generation
"""

from __future__ import annotations

import filecmp
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parents[1]
PROTO_ROOT = ROOT / "proto"
PACKAGE = PROTO_ROOT / "vflsec" / "v1"


def generate(out: Path) -> list[Path]:
    protos = sorted(PACKAGE.glob("*.proto"))
    include = Path(protoc.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *map(str, protos),
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return sorted((out / "vflsec" / "v1").glob("*_pb2*"))


def main() -> int:
    if "--check" not in sys.argv[1:]:
        for path in generate(PROTO_ROOT):
            print(f"generated {path.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        stale = [
            p.name
            for p in fresh
            if not (PACKAGE / p.name).exists() or not filecmp.cmp(p, PACKAGE / p.name, shallow=False)
        ]
        committed = {p.name for p in PACKAGE.glob("*_pb2*")}
        extra = sorted(committed - {p.name for p in fresh})
    if stale or extra:
        print(
            f"generated protobuf modules out of sync with proto/: stale={stale} extra={extra}; "
            "run: python scripts/gen_proto.py"
        )
        return 1
    print(f"protobuf modules in sync ({len(fresh)} files)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
