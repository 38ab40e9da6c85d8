"""Outputs never destroy data: the source model, directories and devices are refused with one line and
exit 2; files honour the umask; nothing half-written is left behind."""
import os
import stat
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper as h

from mnntool import api
from mnntool.errors import MnnToolError


def _model(path):
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 4])])
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), path)
    return path


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mnntool", *map(str, args)], capture_output=True, text=True)


def test_converting_onto_the_source_is_refused(tmp_path):
    src = _model(tmp_path / "m.onnx")
    before = src.read_bytes()
    done = _cli("convert", src, src)
    assert done.returncode == 2 and "source model" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert src.read_bytes() == before


def test_a_directory_as_output_is_refused(tmp_path):
    src = _model(tmp_path / "m.onnx")
    done = _cli("convert", src, tmp_path)
    assert done.returncode == 2 and "is a directory" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_device_is_never_replaced(tmp_path):
    src = _model(tmp_path / "m.onnx")
    done = _cli("convert", src, "/dev/full")
    assert done.returncode == 2 and "not a regular file" in done.stderr
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_outputs_honour_the_umask_and_leave_no_temporary(tmp_path):
    src = _model(tmp_path / "m.onnx")
    old = os.umask(0o027)
    try:
        api.convert(src, tmp_path / "m.mnn")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "m.mnn").st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.mnn", "m.onnx"]


def test_unwritable_directory_is_one_line(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    src = _model(tmp_path / "m.onnx")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(MnnToolError, match="cannot write"):
        api.convert(src, ro / "m.mnn")


def test_run_output_onto_a_file_is_refused(tmp_path):
    src = _model(tmp_path / "m.onnx")
    api.convert(src, tmp_path / "m.mnn")
    target = tmp_path / "out.txt"
    target.write_text("keep me")
    done = _cli("run", tmp_path / "m.mnn", "-o", target)
    assert done.returncode == 2 and "not a directory" in done.stderr
    assert target.read_text() == "keep me"
    np.testing.assert_equal(target.exists(), True)


def test_markup_and_escapes_in_names_print_as_text(tmp_path):
    """A path with Rich markup and a tensor name with an ESC sequence: one plain line, no MarkupError."""
    d = tmp_path / "a[/]b[bold red]"       # '/' makes it two directories: "a[" and "]b[bold red]"
    d.mkdir(parents=True)
    g = h.make_graph([h.make_node("Relu", ["x"], ["y\x1b[31m"])], "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y\x1b[31m", TP.FLOAT, [1, 4])])
    src = d / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    done = _cli("convert", src, d / "missing" / "m.mnn")
    assert done.returncode == 2 and "MarkupError" not in done.stderr and "[/]b[bold red]" in done.stderr
    ok = _cli("convert", src, d / "m.mnn")
    assert ok.returncode == 0 and "[/]b[bold red]" in ok.stdout
    info = _cli("info", d / "m.mnn")
    assert info.returncode == 0 and "\x1b[31m" not in info.stdout


def test_more_threads_than_cores_warns(tmp_path):
    src = _model(tmp_path / "m.onnx")
    api.convert(src, tmp_path / "m.mnn")
    done = _cli("bench", tmp_path / "m.mnn", "--threads", str((os.cpu_count() or 1) + 62), "--runs", "2",
                "--warmup", "0", "--json")
    assert done.returncode == 0 and "warning" in done.stderr and "core" in done.stderr


def _refused_graph(tmp_path, g, match):
    """The graph saved as ONNX, refused by convert with `match` in the error, and no output left."""
    src = tmp_path / "m.onnx"
    onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), src)
    with pytest.raises(MnnToolError, match=match):
        api.convert(src, tmp_path / "m.mnn")
    assert not (tmp_path / "m.mnn").exists()


def test_reshape_beyond_int32_is_refused_not_clipped(tmp_path):
    from onnx import numpy_helper as nh
    g = h.make_graph([h.make_node("Reshape", ["x", "s"], ["y"])], "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)],
                     initializer=[nh.from_array(np.array([1, 2**40], np.int64), "s")])
    _refused_graph(tmp_path, g, "int32")


def test_output_no_op_produces_is_refused(tmp_path):
    g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 4])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [1, 4]), h.make_tensor_value_info("ghost", TP.FLOAT, [1])])
    _refused_graph(tmp_path, g, "ghost")


def test_weights_past_what_a_mnn_holds_are_refused_before_writing(tmp_path):
    """A .mnn is one FlatBuffers file (2 GB at most): larger weights kept in it (not written to a
    .mnn.weight file) are one line, not a corrupt file."""
    from mnntool.format import writer
    from mnntool.ir.graph import Graph, Node
    g = Graph(source="ONNX", name="big")
    g.inputs, g.outputs = ["x"], ["y"]
    g.info("x").shape, g.info("x").dtype = (1, 4), "float32"
    g.constants["w"] = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), (600_000_000,), (0,))
    g.nodes.append(Node("BinaryOp", ["x", "w"], ["y"], "y", {"opType": "ADD"}))
    with pytest.raises(MnnToolError, match="2 GB.*--external-weights"):
        writer.save(g, tmp_path / "m.mnn", external=False)
    assert not list(tmp_path.iterdir())
