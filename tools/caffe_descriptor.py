"""Regenerate mnntool/frontends/caffe/caffe.desc from caffe.proto with protoc (grpcio-tools ships it):
    python tools/caffe_descriptor.py [--check]
--check exits 1 when the checked-in descriptor differs from what protoc makes now."""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent / "mnntool" / "frontends" / "caffe"


def compile_descriptor() -> bytes:
    """protoc in a child process (in-process, grpc_tools' protobuf can crash beside another copy loaded)."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "caffe.desc"
        p = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{HERE}", f"--descriptor_set_out={out}",
                            str(HERE / "caffe.proto")], capture_output=True, text=True)
        if p.returncode != 0:
            raise SystemExit(f"protoc failed ({p.returncode}): {p.stderr.strip()}")
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
