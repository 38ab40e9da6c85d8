"""Caffe frontend: nets written as protobuf messages -> .mnn -> mnntool's runtime and the real MNN runtime,
compared with OpenCV's Caffe importer (cv2.dnn.readNetFromCaffe) as the reference runtime
(cosine >= 0.9999, max abs <= 1e-3 x the output's scale). Interp/Upsample (not in OpenCV) against torch."""
import numpy as np
import pytest

import mnntool
from mnntool import api
from tests.conftest import CACHE, assert_close, mnn_run
from tests.test_cli import assert_one_line_error, run

cv2 = pytest.importorskip("cv2")


def _opencv(proto, x, names):
    net = cv2.dnn.readNetFromCaffe(str(proto), str(proto.with_suffix(".caffemodel")))
    net.enableFusion(False)
    net.setInput(x)
    return dict(zip(names, net.forward(names)))


@pytest.mark.parametrize("name,extra", [("layer_zoo", []), ("resnet18", []), ("mobilenetv2", ["fc"])])
def test_caffe_net_matches_opencv_in_both_runtimes(tmp_path, name, extra):
    from fixtures.caffe_models import build
    proto = build(name, CACHE)
    dst = tmp_path / f"{name}.mnn"
    api.convert(proto, dst)
    sess = mnntool.load(dst)
    g = sess.graph
    x = np.random.default_rng(1).standard_normal(g.tensors[g.inputs[0]].shape).astype(np.float32)
    names = list(g.outputs) + extra
    ref = _opencv(proto, x, names)
    ours = sess.run({"data": x}, keep_all=True)
    theirs = mnn_run(dst, ["data"], names, {"data": x})
    for n in names:
        assert_close(ref[n], ours[n])
        assert_close(ref[n], theirs[n])


def test_in_place_layers_keep_blob_names_and_no_bn_left(tmp_path):
    from fixtures.caffe_models import build
    proto = build("resnet18", CACHE)
    g = api.load_graph(proto)
    assert g.outputs == ["fc1000"]
    assert sum(n.op == "BatchNorm" for n in g.nodes) == 20 and sum(n.op == "Scale" for n in g.nodes) == 20
    # BatchNorm is lowered by one pass for every frontend, then folds into the convolutions
    dst = tmp_path / "r.mnn"
    api.convert(proto, dst)
    ops = api.info(dst)["op_counts"]
    assert "Scale" not in ops and "ReLU" not in ops and "BatchNorm" not in ops


def _resize_net(tmp_path, type_, param):
    from fixtures.caffe_models import NetBuilder
    b = NetBuilder("resize")
    x = b.input("data", [1, 4, 7, 9])
    b.simple("up", type_, [x], (1, 4, 1, 1), **param)
    return b.save(tmp_path)


@pytest.mark.parametrize("type_,param,torch_args", [
    ("Interp", {"interp_param": {"zoom_factor": 3}}, {"size": (19, 25), "mode": "bilinear", "align_corners": True}),
    ("Interp", {"interp_param": {"height": 5, "width": 4}}, {"size": (5, 4), "mode": "bilinear",
                                                            "align_corners": True}),
    ("Upsample", {"upsample_param": {"scale": 2}}, {"scale_factor": 2, "mode": "nearest"}),
])
def test_resize_layers_match_torch(tmp_path, type_, param, torch_args):
    torch = pytest.importorskip("torch")
    proto = _resize_net(tmp_path, type_, param)
    dst = tmp_path / "r.mnn"
    api.convert(proto, dst)
    x = np.random.default_rng(2).standard_normal((1, 4, 7, 9)).astype(np.float32)
    ref = torch.nn.functional.interpolate(torch.from_numpy(x), **torch_args).numpy()
    assert_close(ref, mnntool.load(dst).run({"data": x})["up"])
    assert_close(ref, mnn_run(dst, ["data"], ["up"], {"data": x})["up"])


def test_bad_caffe_inputs_give_one_line_errors(tmp_path):
    from fixtures.caffe_models import NetBuilder
    b = NetBuilder("odd")
    x = b.input("data", [1, 3, 8, 8])
    b.simple("det", "PSROIPooling", [x], (1, 3, 8, 8))
    b.simple("prop", "Proposal", ["det"], (1, 3, 8, 8))
    proto = b.save(tmp_path)
    out = tmp_path / "o.mnn"
    assert_one_line_error(*run("convert", proto, out), "unsupported Caffe layers", "PSROIPooling ('det')",
                          "Proposal ('prop')")
    proto.with_suffix(".caffemodel").write_bytes(b"\xff\xff\xff garbage")
    assert_one_line_error(*run("convert", proto, out), "not a Caffe caffemodel")
    proto.with_suffix(".caffemodel").unlink()
    assert_one_line_error(*run("convert", proto, out), "caffemodel", "does not exist")
    proto.write_text("layer { name: 'x' type: ")
    proto.with_suffix(".caffemodel").write_bytes(b"")
    assert_one_line_error(*run("convert", proto, out), "not a Caffe prototxt")
    proto.write_text("layers { name: 'conv' bottom: 'data' top: 'conv' }")
    assert_one_line_error(*run("convert", proto, out), "V1 layer 'conv' has no type")
    proto.write_text("input: 'data'\nlayer { name: 'r' type: 'ReLU' bottom: 'data' top: 'r' }")
    assert_one_line_error(*run("convert", proto, out), "--input-shape data:")
    assert not out.exists()
    assert run("convert", proto, out, "--input-shape", "data:1x2x3x3")[0] == 0
    assert out.exists()


def test_missing_weights_blob_names_the_layer(tmp_path):
    from fixtures.caffe_models import NetBuilder
    b = NetBuilder("noweights")
    x = b.input("data", [1, 3, 8, 8])
    b.conv("conv", x, 4, 3)
    proto = b.save(tmp_path)
    proto.with_suffix(".caffemodel").write_bytes(b"")
    assert_one_line_error(*run("convert", proto, tmp_path / "o.mnn"), "Convolution layer 'conv'", "weight")


def test_vendored_descriptor_is_what_protoc_makes():
    """caffe.desc is protoc's compilation of caffe.proto (oneof, extensions, comments: protoc's parser)."""
    pytest.importorskip("grpc_tools")
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("caffe_descriptor", Path(__file__).parents[2] / "tools" /
                                                  "caffe_descriptor.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.compile_descriptor() == (tool.HERE / "caffe.desc").read_bytes()
