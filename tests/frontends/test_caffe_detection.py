"""SSD's head (PriorBox feeding DetectionOutput) converted from Caffe and run in mnntool's runtime and in
MNN, against OpenCV's Caffe importer. OpenCV writes keep_top_k rows (image, label, score, xmin, ymin, xmax,
ymax), zero-filled past the detections; both runtimes give the detections only, as (label, score, box) rows
best first, which must be OpenCV's rows to 1e-5 (labels exactly). Unsupported configurations are refused."""
import subprocess
import sys

import numpy as np
import pytest

import mnntool
from fixtures.caffe_models import NetBuilder
from mnntool import api
from mnntool.errors import MnnToolError
from tests.conftest import mnn_run

cv2 = pytest.importorskip("cv2")

FEAT, IMAGE, CLASSES = (1, 4, 5, 6), (1, 3, 60, 72), 4
PRIORS = 5 * 6 * 4      # min, max and the two ratio-2 boxes per cell


def _head(conf_t=0.3, keep=30, nms=0.45, top_k=400, consumer=False, **det):
    b = NetBuilder("ssd_head")
    b.input("feat", list(FEAT))
    b.input("image", list(IMAGE))
    b.input("loc", [1, PRIORS * 4])
    b.input("conf", [1, PRIORS * CLASSES])
    pb = b._layer("pb", "PriorBox", ["feat", "image"], ["pri"]).prior_box_param
    pb.min_size, pb.max_size, pb.clip = 15, 30, False
    pb.aspect_ratio.append(2.0)
    pb.variance.extend([0.1, 0.1, 0.2, 0.2])
    d = b._layer("det", "DetectionOutput", ["loc", "conf", "pri"], ["det"]).detection_output_param
    d.num_classes, d.share_location, d.background_label_id, d.code_type = CLASSES, True, 0, 2
    d.keep_top_k, d.confidence_threshold = keep, conf_t
    d.nms_param.nms_threshold, d.nms_param.top_k = nms, top_k
    for k, v in det.items():
        setattr(d, k, v)
    if consumer:
        b._layer("after", "Sigmoid", ["det"], ["after"])
    return b


def _feeds(seed):
    r = np.random.default_rng(seed)
    logits = r.standard_normal((PRIORS, CLASSES)) * 2
    conf = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return {"feat": np.zeros(FEAT, np.float32), "image": np.zeros(IMAGE, np.float32),
            "loc": (r.standard_normal((1, PRIORS * 4)) * 0.5).astype(np.float32),
            "conf": conf.reshape(1, -1).astype(np.float32)}


@pytest.mark.parametrize("conf_t,keep,nms,seed", [(0.3, 30, 0.45, 1), (0.9, 30, 0.45, 2), (0.2, 200, 0.3, 3),
                                                  (0.5, -1, 0.6, 4), (0.9999, 10, 0.45, 5)])
def test_ssd_head_matches_opencv_in_both_runtimes(tmp_path, conf_t, keep, nms, seed):
    proto = _head(conf_t, keep, nms).save(tmp_path)
    feeds = _feeds(seed)
    if keep < 0:     # keep everything: OpenCV 4.14 corrupts its heap on keep_top_k -1, so it runs the same
        proto = _head(conf_t, PRIORS * (CLASSES - 1), nms).save(tmp_path / "cv")     # net with room for all
    net = cv2.dnn.readNetFromCaffe(str(proto), str(proto.with_suffix(".caffemodel")))
    for k, v in feeds.items():
        net.setInput(v, k)
    ref = net.forward("det").reshape(-1, 7)
    ref = ref[ref[:, 2] > 0][:, 1:]             # OpenCV's detections, without its zero rows and image column
    dst = tmp_path / "det.mnn"
    api.convert(tmp_path / "ssd_head.prototxt", dst)
    ours = mnntool.load(dst).run(feeds)["det"]
    theirs = mnn_run(dst, list(feeds), ["det"], feeds)["det"]
    for got in (ours, theirs):
        assert got.shape == (1, 1, ref.shape[0], 6)
        got = got.reshape(-1, 6)
        np.testing.assert_array_equal(got[:, 0], ref[:, 0])
        np.testing.assert_allclose(got[:, 1:], ref[:, 1:], atol=1e-5)
    if conf_t < 0.9:
        assert ref.shape[0] >= 10       # the case exercises NMS and keep_top_k, not an empty result


@pytest.mark.parametrize("change,message", [
    ({"share_location": False}, "share_location: false is not supported"),
    ({"background_label_id": -1}, "background_label_id -1 is not supported"),
    ({"code_type": 1}, "code_type 1 (only CENTER_SIZE = 2) is not supported"),
    ({"variance_encoded_in_target": True}, "variance_encoded_in_target: true is not supported"),
    ({"consumer": True}, "reads a DetectionOutput's result"),
])
def test_configurations_mnn_cannot_run_are_refused(tmp_path, change, message):
    proto = _head(**change).save(tmp_path)
    with pytest.raises(MnnToolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        api.convert(proto, tmp_path / "det.mnn")
    assert not (tmp_path / "det.mnn").exists()


def test_cli_refusal_is_one_line_exit_2(tmp_path):
    proto = _head(share_location=False).save(tmp_path)
    p = subprocess.run([sys.executable, "-m", "mnntool", "convert", str(proto), str(tmp_path / "d.mnn")],
                       capture_output=True, text=True)
    assert p.returncode == 2, p.stderr
    assert "DetectionOutput layer 'det'" in p.stderr and "Traceback" not in p.stderr
