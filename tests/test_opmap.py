"""The op map (`mnntool ops --where`, docs/contributing/op-map.md) read from the registries: every IR op,
its definition's file, the converters that emit it, its kernel or the numpy fallback, its tests."""
import json
from pathlib import Path

from typer.testing import CliRunner

from mnntool.cli import app
from mnntool.ir.ops import REGISTRY
from mnntool.opmap import FRONTENDS, markdown, op_map

ROOT = Path(__file__).resolve().parents[1]


def test_every_op_once_with_files_that_exist():
    rows = op_map()
    assert [r["op"] for r in rows] == sorted(REGISTRY)
    for r in rows:
        assert (ROOT / r["definition"]).is_file(), r
        for fw in FRONTENDS:
            for c in r["converters"][fw]:
                path, line = c["at"].rsplit(":", 1)
                assert (ROOT / path).is_file() and int(line) > 0, c
        assert r["kernel"] == "numpy fallback" or (ROOT / r["kernel"].rsplit(":", 1)[0]).is_file()
        assert all((ROOT / t).is_file() for t in r["tests"])


def test_it_finds_what_is_where():
    rows = {r["op"]: r for r in op_map()}
    assert rows["LRN"]["definition"] == "mnntool/ir/ops/norm.py"
    assert rows["GridSample"]["definition"] == "mnntool/ir/ops/sampling.py"
    assert rows["DetectionOutput"]["definition"] == "mnntool/ir/ops/detection.py"
    roi = rows["ROIPooling"]["converters"]
    assert [c["source"] for c in roi["onnx"]] == ["MaxRoiPool"] and roi["onnx"][0]["at"].startswith(
        "mnntool/frontends/onnx/nn.py:")
    assert [c["source"] for c in roi["caffe"]] == ["ROIPooling"]
    assert "Conv" in {c["source"] for c in rows["Convolution"]["converters"]["onnx"]}
    assert "LRN" in {c["source"] for c in rows["LRN"]["converters"]["tensorflow"]}     # through emit_onnx
    assert rows["Convolution"]["kernel"].startswith("mnntool/runtime/kernels/")
    assert rows["ScatterElements"]["kernel"] == "numpy fallback"
    assert "tests/frontends/test_onnx_ops.py" in rows["ReverseSequence"]["tests"]


def test_ops_where_json_and_docs_table():
    res = CliRunner().invoke(app, ["ops", "--where", "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["count"] == len(REGISTRY) == len(d["ops"])
    table = markdown().splitlines()
    assert len(table) == 2 + len(REGISTRY) and table[0].startswith("| op | kind | definition | onnx |")
