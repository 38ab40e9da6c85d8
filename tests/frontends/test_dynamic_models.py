"""Models whose dims stay open: converted without --input-shape, one .mnn runs every shape in both
runtimes (a plan per shape in mnntool's), and a decoder step with a KV cache generates token by token.

Reference: torch eager on the same module (both exporters' files of the decoder). Tolerance: max abs
error 1e-4 (cosine for the CNN: >= 0.99999).
"""
import contextlib
import io

import numpy as np
import pytest

from mnntool import api
from mnntool.runtime.session import Session

torch = pytest.importorskip("torch")


def _cos(a, b):
    return float(a.ravel() @ b.ravel() / (np.linalg.norm(a) * np.linalg.norm(b)))


class SmallCNN(torch.nn.Module):
    """Conv/BN/act, a strided block, global pool, flatten and a linear head: what fixes N or H/W first."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Hardswish(),
            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=8), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.body(x))


@pytest.mark.parametrize("dynamo", [False, True])
def test_open_batch_and_size_run_at_several_shapes(tmp_path, dynamo):
    from mnntool.runtime.mnn_backend import MnnSession
    torch.manual_seed(0)
    m = SmallCNN().eval()
    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn.mnn"
    x = torch.randn(2, 3, 64, 64)      # torch.export fixes a dim whose example is 1
    with contextlib.redirect_stdout(io.StringIO()):
        if dynamo:
            n, hh, ww = (torch.export.Dim(k, min=1, max=512) for k in "NHW")
            torch.onnx.export(m, (x,), str(src), input_names=["x"], output_names=["y"], dynamo=True,
                              dynamic_shapes={"x": {0: n, 2: hh, 3: ww}})
        else:
            torch.onnx.export(m, (x,), str(src), input_names=["x"], output_names=["y"], dynamo=False,
                              dynamic_axes={"x": {0: "N", 2: "H", 3: "W"}, "y": {0: "N"}})
    api.convert(src, dst)
    g = api.load_graph(dst)
    assert not isinstance(g.tensors["x"].shape[2], int), "the open height was fixed at convert"
    ours, theirs = Session(g), MnnSession(str(dst), g.inputs, g.outputs)
    for shape in ((1, 3, 32, 32), (2, 3, 48, 40), (3, 3, 17, 90), (1, 3, 32, 32)):
        xa = torch.randn(*shape)
        with torch.no_grad():
            ref = m(xa).numpy()
        for got in (ours.run({"x": xa.numpy()})["y"], theirs.run({"x": xa.numpy()})["y"]):
            assert got.shape == ref.shape
            assert _cos(got, ref) >= 0.99999
            np.testing.assert_allclose(got, ref, atol=1e-4)


def test_decoder_step_with_kv_cache_generates(tmp_path):
    from fixtures.decoder import export
    from mnntool.runtime.mnn_backend import MnnSession
    src, dst = tmp_path / "dec.onnx", tmp_path / "dec.mnn"
    with contextlib.redirect_stdout(io.StringIO()):
        m = export(src, dynamo=False)
    api.convert(src, dst)
    g = api.load_graph(dst)
    ours, theirs = Session(g), MnnSession(str(dst), g.inputs, g.outputs)
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (1, 4), generator=gen)
    pk, pv = torch.randn(2, 1, 4, 1, 16, generator=gen), torch.randn(2, 1, 4, 1, 16, generator=gen)
    for _ in range(4):         # a prompt of 4, then one token at a time with the cache fed back
        with torch.no_grad():
            ref = [o.numpy() for o in m(ids, pk, pv)]
        feeds = {"ids": ids.numpy(), "past_k": pk.numpy(), "past_v": pv.numpy()}
        a, b = ours.run(feeds), theirs.run(feeds)
        for name, r in zip(("logits", "new_k", "new_v"), ref):
            np.testing.assert_allclose(a[name], r, atol=1e-4)
            np.testing.assert_allclose(b[name], r, atol=1e-4)
        pk, pv = torch.from_numpy(a["new_k"]), torch.from_numpy(a["new_v"])
        ids = torch.from_numpy(a["logits"][:, -1:].argmax(-1))
    assert pk.shape[3] == 1 + 4 + 3


def test_decoder_dynamo_export_matches_torch(tmp_path):
    """The dynamo exporter's file of the decoder (its lengths as torch.export Dims) in mnntool's runtime
    against eager torch and onnxruntime, at two (new, past) lengths."""
    ort = pytest.importorskip("onnxruntime")
    from fixtures.decoder import export
    src, dst = tmp_path / "dec.onnx", tmp_path / "dec.mnn"
    with contextlib.redirect_stdout(io.StringIO()):
        m = export(src, dynamo=True)
    api.convert(src, dst)
    sess = Session(api.load_graph(dst))
    rng = np.random.RandomState(0)
    for t, p in ((3, 5), (1, 9)):
        feeds = {"ids": rng.randint(0, 97, (1, t)).astype(np.int64), "past_k": rng.randn(2, 1, 4, p, 16).astype(np.float32),
                 "past_v": rng.randn(2, 1, 4, p, 16).astype(np.float32)}
        with torch.no_grad():
            ref = [o.numpy() for o in m(*(torch.from_numpy(feeds[k]) for k in ("ids", "past_k", "past_v")))]
        theirs = ort.InferenceSession(str(src)).run(None, feeds)
        got = sess.run(feeds)
        for name, r, o in zip(("logits", "new_k", "new_v"), ref, theirs):
            np.testing.assert_allclose(got[name], r, atol=1e-4)
            np.testing.assert_allclose(o, r, atol=1e-4)
        # the shape arithmetic of this plan (Shape, its slices and concats) is constants, not steps
        assert not {"Shape", "Rank", "Size"} & {st.op for st in sess.plan.ran}


@pytest.mark.parametrize("dynamo", [False, True])
def test_detector_head_with_range_on_open_sizes(tmp_path, dynamo):
    """A YOLOv8-style head builds its anchor grid with arange over each map's run-time H and W: the Range
    ops stay in the file and one .mnn runs two image sizes. Tolerance: 1e-4 x the box scale."""
    from fixtures.detector import export
    from mnntool.runtime.mnn_backend import MnnSession
    src, dst = tmp_path / "det.onnx", tmp_path / "det.mnn"
    with contextlib.redirect_stdout(io.StringIO()):
        m = export(src, dynamo=dynamo)
    api.convert(src, dst)
    g = api.load_graph(dst)
    assert sum(n.op == "Range" for n in g.nodes) >= 3
    ours, theirs = Session(g), MnnSession(str(dst), g.inputs, g.outputs)
    for shape in ((1, 3, 128, 160), (1, 3, 96, 224)):
        x = torch.randn(*shape)
        with torch.no_grad():
            ref = [r.numpy() for r in m(x)]
        for got in (ours.run({"images": x.numpy()}), theirs.run({"images": x.numpy()})):
            for name, r in zip(("boxes", "scores"), ref):
                assert got[name].shape == r.shape
                np.testing.assert_allclose(got[name], r, atol=1e-4 * max(1.0, float(np.abs(r).max())))
