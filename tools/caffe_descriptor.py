"""Regenerate mnntool/frontends/caffe/caffe.desc from caffe.proto with protoc (grpcio-tools ships it):
    python tools/caffe_descriptor.py [--check]
--check exits 1 when the checked-in descriptor differs from what protoc makes now."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "mnntool" / "frontends" / "caffe"


def compile_descriptor() -> bytes:
    from grpc_tools import protoc
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "caffe.desc"
        code = protoc.main(["protoc", f"-I{HERE}", f"--descriptor_set_out={out}", str(HERE / "caffe.proto")])
        if code != 0:
            raise SystemExit(f"protoc failed ({code})")
        return out.read_bytes()


def main() -> int:
    data = compile_descriptor()
    target = HERE / "caffe.desc"
    if "--check" in sys.argv[1:]:
        return 0 if target.read_bytes() == data else 1
    target.write_bytes(data)
    print(f"wrote {target} ({len(data)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
