"""Caffe layers one at a time: a net of Input layer(s) and the layer, converted and run in mnntool's runtime
and in MNN, against OpenCV's Caffe importer where OpenCV has the layer (and reads its parameters: its LRN
ignores k, its Log layer scale and shift), else against Caffe's own forward
formula written out in numpy from Caffe's layer source (named per case). Cosine >= 0.9999 and max abs
<= 1e-3 x the output's scale."""
import numpy as np
import pytest

import mnntool
from fixtures.caffe_models import NetBuilder
from mnntool import api
from tests.conftest import assert_close, mnn_run

cv2 = pytest.importorskip("cv2")
R = np.random.default_rng(5)


def _net(type_, inputs: dict, params=None, blobs=(), n_tops=1):
    b = NetBuilder(f"net_{type_}")
    for name, shape in inputs.items():
        b.input(name, list(shape))
    lay = b._layer("L", type_, list(inputs), ["L"] if n_tops == 1 else [f"L{k}" for k in range(n_tops)], blobs)
    for field, values in (params or {}).items():
        msg = getattr(lay, field)
        for key, v in values.items():
            if isinstance(v, (list, tuple)):
                getattr(msg, key).extend(v)
            else:
                setattr(msg, key, v)
    return b


def _run(tmp_path, b, feeds, tops):
    proto = b.save(tmp_path)
    dst = tmp_path / "net.mnn"
    api.convert(proto, dst)
    g = api.load_graph(dst)
    assert sorted(g.outputs) == sorted(tops), g.outputs
    return proto, mnntool.load(dst).run(feeds), mnn_run(dst, list(feeds), tops, feeds)


def _opencv(proto, feeds, tops):
    net = cv2.dnn.readNetFromCaffe(str(proto), str(proto.with_suffix(".caffemodel")))
    net.enableFusion(False)
    for k, v in feeds.items():
        net.setInput(v, k)
    return dict(zip(tops, net.forward(tops)))


X = R.standard_normal((1, 8, 6, 7)).astype(np.float32)
POS = (np.abs(X) + 0.1).astype(np.float32)

# layer -> (inputs, params, blobs)
OPENCV_CASES = {
    "BNLL": ({"data": X}, {}, ()),
    "Exp": ({"data": X}, {"exp_param": {"base": 2.0, "scale": 0.5, "shift": 0.25}}, ()),
    "LRN": ({"data": X}, {"lrn_param": {"local_size": 3, "alpha": 0.3, "beta": 0.75}}, ()),
    "LRN_within": ({"data": X}, {"lrn_param": {"local_size": 3, "alpha": 0.3, "beta": 0.75, "norm_region": 1}}, ()),
    "MVN": ({"data": X}, {"mvn_param": {"eps": 1e-5}}, ()),
    "MVN_across": ({"data": X}, {"mvn_param": {"across_channels": True, "normalize_variance": False}}, ()),
    "Normalize": ({"data": X}, {"norm_param": {"across_spatial": False, "channel_shared": False}},
                  (R.random(8).astype(np.float32) + 0.5,)),
    "Normalize_spatial": ({"data": X}, {"norm_param": {"across_spatial": True, "channel_shared": True}},
                          (np.asarray([3.0], np.float32),)),
    "Crop": ({"data": X, "ref": np.zeros((1, 8, 4, 3), np.float32)}, {"crop_param": {"axis": 2, "offset": [1, 2]}},
             ()),
    "ShuffleChannel": ({"data": X}, {"shuffle_channel_param": {"group": 4}}, ()),
    "Swish": ({"data": X}, {}, ()),
    "Mish": ({"data": X}, {}, ()),
    "PriorBox": ({"data": X, "image": np.zeros((1, 3, 60, 70), np.float32)},
                 {"prior_box_param": {"min_size": 20.0, "max_size": 45.0, "aspect_ratio": [2.0, 3.0],
                                      "variance": [0.1, 0.1, 0.2, 0.2], "clip": False}}, ()),
    "ROIPooling": ({"data": R.standard_normal((2, 4, 12, 14)).astype(np.float32),
                    "rois": np.asarray([[0, 1, 2, 9, 8], [1, 0, 0, 13, 11], [0, 4.4, 3.6, 5.2, 4.9],
                                        [1, 6, 1, 30, 40]], np.float32)},
                   {"roi_pooling_param": {"pooled_h": 3, "pooled_w": 2, "spatial_scale": 0.5}}, ()),
}


@pytest.mark.parametrize("case", sorted(OPENCV_CASES))
def test_layer_matches_opencv_in_both_runtimes(tmp_path, case):
    inputs, params, blobs = OPENCV_CASES[case]
    b = _net(case.split("_")[0], {k: v.shape for k, v in inputs.items()}, params, blobs)
    proto, ours, theirs = _run(tmp_path, b, inputs, ["L"])
    ref = _opencv(proto, inputs, ["L"])["L"]
    assert_close(ref, ours["L"])
    assert_close(ref, theirs["L"])


def _caffe_argmax(x, top_k, axis=None, out_max_val=False):
    """argmax_layer.cpp: descending partial sort of (value, index) pairs."""
    if axis is None:
        flat = x.reshape(x.shape[0], -1)
        idx = np.argsort(-flat, axis=1, kind="stable")[:, :top_k]
        vals = np.take_along_axis(flat, idx, 1)
        out = np.stack([idx.astype(np.float32), vals], 1) if out_max_val else idx[:, None].astype(np.float32)
        return out.reshape(out.shape + (1,) * (x.ndim - 3))
    idx = np.argsort(-x, axis=axis, kind="stable").take(range(top_k), axis=axis)
    return np.take_along_axis(x, idx, axis) if out_max_val else idx.astype(np.float32)


def _caffe_spp(x, levels, pool):
    """spp_layer.cpp: per level 2^l bins, kernel ceil(size/bins), pad (kernel*bins - size + 1)/2, stride =
    kernel; Caffe's pooling output size ceil((size + 2 pad - k) / s) + 1, clipped to start inside."""
    n, c, h, w = x.shape
    parts = []
    for lv in range(levels):
        bins = 2 ** lv
        kh, kw = -(-h // bins), -(-w // bins)
        ph, pw = (kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2
        oh, ow = -(-(h + 2 * ph - kh) // kh) + 1, -(-(w + 2 * pw - kw) // kw) + 1
        oh -= (oh - 1) * kh >= h + ph
        ow -= (ow - 1) * kw >= w + pw
        out = np.zeros((n, c, oh, ow), np.float32)
        for i in range(oh):
            for j in range(ow):
                hs, ws = i * kh - ph, j * kw - pw
                he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
                area = (he - hs) * (we - ws)
                win = x[:, :, max(hs, 0):min(he, h), max(ws, 0):min(we, w)]
                out[:, :, i, j] = win.max(axis=(2, 3)) if pool == 0 else win.sum(axis=(2, 3)) / area
        parts.append(out.reshape(n, -1))
    return np.concatenate(parts, 1)


EMB_W, EMB_B = R.standard_normal((10, 4)).astype(np.float32), R.standard_normal(4).astype(np.float32)
PARAM = R.standard_normal((1, 8, 6, 7)).astype(np.float32)
IDS = np.asarray([[3, 0, 9], [1, 1, 7]], np.float32)

# layer -> (inputs, params, blobs, numpy reference from Caffe's formula)
NUMPY_CASES = {
    "Log": ({"data": POS}, {"log_param": {"scale": 2.0, "shift": 0.5}}, (), lambda d: np.log(2 * d["data"] + 0.5)),
    "Log_base": ({"data": POS}, {"log_param": {"base": 10.0}}, (), lambda d: np.log10(d["data"])),
    "Tile": ({"data": X}, {"tile_param": {"axis": 2, "tiles": 3}}, (), lambda d: np.tile(d["data"], (1, 1, 3, 1))),
    "Axpy": ({"a": R.standard_normal((1, 8, 1, 1)).astype(np.float32), "data": X, "y": X[:, ::-1].copy()}, {}, (),
             lambda d: d["a"] * d["data"] + d["y"]),
    "LRN_k": ({"data": X}, {"lrn_param": {"local_size": 3, "alpha": 0.3, "beta": 0.75, "k": 2.0}}, (),
              lambda d: d["data"] / (2.0 + 0.1 * sum(np.pad(np.square(d["data"]), ((0, 0), (1, 1), (0, 0), (0, 0)))
                                                    [:, c:c + 8] for c in range(3))) ** 0.75),
    "Threshold": ({"data": X}, {"threshold_param": {"threshold": 0.3}}, (), lambda d: (d["data"] > 0.3) * 1.0),
    "Reduction": ({"data": X}, {"reduction_param": {"operation": 3, "axis": 1, "coeff": 0.5}}, (),
                  lambda d: 0.5 * np.square(d["data"]).sum(axis=(1, 2, 3))),
    "Reduction_asum": ({"data": X}, {"reduction_param": {"operation": 2, "axis": -1}}, (),
                       lambda d: np.abs(d["data"]).sum(axis=-1)),
    "Reduction_mean": ({"data": X}, {"reduction_param": {"operation": 4, "axis": 2}}, (),
                       lambda d: d["data"].mean(axis=(2, 3))),
    "ArgMax": ({"data": X}, {"argmax_param": {"axis": 1, "top_k": 2}}, (), lambda d: _caffe_argmax(d["data"], 2, 1)),
    "ArgMax_flat": ({"data": X}, {"argmax_param": {"top_k": 3, "out_max_val": True}}, (),
                    lambda d: _caffe_argmax(d["data"], 3, None, True)),
    "SPP": ({"data": X}, {"spp_param": {"pyramid_height": 3}}, (), lambda d: _caffe_spp(d["data"], 3, 0)),
    "SPP_ave": ({"data": X}, {"spp_param": {"pyramid_height": 2, "pool": 1}}, (),
                lambda d: _caffe_spp(d["data"], 2, 1)),
    "Embed": ({"data": IDS}, {"embed_param": {"num_output": 4, "input_dim": 10}}, (EMB_W, EMB_B),
              lambda d: EMB_W[d["data"].astype(int)] + EMB_B),
    "BatchReindex": ({"data": R.standard_normal((4, 3, 2)).astype(np.float32),
                      "idx": np.asarray([3, 0, 0, 2, 1], np.float32)}, {}, (),
                     lambda d: d["data"][d["idx"].astype(int)]),
}


@pytest.mark.parametrize("case", sorted(NUMPY_CASES))
def test_layer_matches_caffe_formula_in_both_runtimes(tmp_path, case):
    inputs, params, blobs, ref_fn = NUMPY_CASES[case]
    b = _net(case.split("_")[0], {k: v.shape for k, v in inputs.items()}, params, blobs)
    _, ours, theirs = _run(tmp_path, b, inputs, ["L"])
    ref = np.asarray(ref_fn(inputs), np.float32)
    assert ours["L"].shape == theirs["L"].shape == ref.shape
    assert_close(ref, ours["L"])
    assert_close(ref, theirs["L"])


@pytest.mark.parametrize("type_", ["Parameter", "DummyData"])
def test_constant_layers_feed_the_net(tmp_path, type_):
    """Parameter (a learned blob) and DummyData (a constant filler) as operands of an Eltwise sum."""
    b = NetBuilder(f"net_{type_}")
    b.input("data", [1, 8, 6, 7])
    if type_ == "Parameter":
        lay = b._layer("P", "Parameter", [], ["P"], (PARAM,))
        lay.parameter_param.shape.dim.extend(PARAM.shape)
        expect = X + PARAM
    else:
        lay = b._layer("P", "DummyData", [], ["P"])
        lay.dummy_data_param.shape.add().dim.extend([1, 8, 6, 7])
        lay.dummy_data_param.data_filler.add(type="constant", value=1.5)
        expect = X + 1.5
    b.shapes["P"] = (1, 8, 6, 7)
    b.eltwise("L", ["data", "P"])
    _, ours, theirs = _run(tmp_path, b, {"data": X}, ["L"])
    assert_close(expect, ours["L"])
    assert_close(expect, theirs["L"])


def test_v1_layers_are_upgraded_as_read(tmp_path):
    """A V1 net (`layers { type: CONVOLUTION }`, blobs in the V1 caffemodel) gives what the same net in the
    current format gives in OpenCV."""
    from google.protobuf import text_format

    from mnntool.frontends.caffe.proto import messages
    from fixtures.caffe_models import NetBuilder as NB
    m = messages()
    w = R.standard_normal((6, 3, 3, 3)).astype(np.float32) * 0.3
    bias = R.standard_normal(6).astype(np.float32)
    v1 = m["NetParameter"](name="v1net")
    v1.input.append("data")
    v1.input_dim.extend([1, 3, 10, 12])
    conv = v1.layers.add(name="conv", type=4)          # CONVOLUTION
    conv.bottom.append("data")
    conv.top.append("conv")
    conv.convolution_param.num_output, conv.convolution_param.pad[:] = 6, [1]
    conv.convolution_param.kernel_size.append(3)
    relu = v1.layers.add(name="relu", type=18)         # RELU
    relu.bottom.append("conv")
    relu.top.append("conv")
    pool = v1.layers.add(name="pool", type=17)         # POOLING
    pool.bottom.append("conv")
    pool.top.append("pool")
    pool.pooling_param.kernel_size, pool.pooling_param.stride = 2, 2
    weights = m["NetWeights"](name="v1net")
    wl = weights.layers.add(name="conv")
    for arr in (w, bias):
        blob = wl.blobs.add()
        blob.num, blob.channels, blob.height, blob.width = (list(arr.shape) + [1, 1, 1])[:4]
        blob.data.extend(arr.reshape(-1).tolist())
    proto = tmp_path / "v1.prototxt"
    proto.write_text(text_format.MessageToString(v1))
    (tmp_path / "v1.caffemodel").write_bytes(weights.SerializeToString())
    x = R.standard_normal((1, 3, 10, 12)).astype(np.float32)
    dst = tmp_path / "v1.mnn"
    api.convert(proto, dst)
    ours = mnntool.load(dst).run({"data": x})["pool"]
    theirs = mnn_run(dst, ["data"], ["pool"], {"data": x})["pool"]
    # the same net written in the current format, run by OpenCV
    nb = NB("v2net")
    nb.input("data", [1, 3, 10, 12])
    lay = nb._layer("conv", "Convolution", ["data"], ["conv"], (w, bias))
    lay.convolution_param.num_output, lay.convolution_param.pad[:] = 6, [1]
    lay.convolution_param.kernel_size.append(3)
    nb._layer("relu", "ReLU", ["conv"], ["conv"])
    p = nb._layer("pool", "Pooling", ["conv"], ["pool"])
    p.pooling_param.kernel_size, p.pooling_param.stride = 2, 2
    ref = _opencv(nb.save(tmp_path / "v2"), {"data": x}, ["pool"])["pool"]
    assert_close(ref, ours)
    assert_close(ref, theirs)
