"""One meaning per int8 file: for each kind of op around int8 tensors, the file mnntool's quantizer
writes gives the same output in mnntool's runtime and in MNN's (cosine >= 0.9999 between the two).

Small torch models, exported with torch.onnx (dynamo=False), converted, quantized with 8 random
calibration samples (mse) and run on a held-out input in both runtimes. Each is also compared with
fp32 (cosine >= 0.99 in MNN) so a file that agrees by being broken in both fails.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from fixtures.trained_stats import measure_batchnorm  # noqa: E402
from mnntool import api  # noqa: E402
from mnntool.compare import metrics  # noqa: E402
from mnntool.format import reader  # noqa: E402
from mnntool.quant import QuantConfig, quantize_file  # noqa: E402
from mnntool.runtime.session import Session  # noqa: E402
from tests.conftest import mnn_run  # noqa: E402


def _cbr(cin, cout, k=3, stride=1, act=nn.ReLU):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2), nn.BatchNorm2d(cout), act())


class ConcatPool(nn.Module):
    """squeezenet's fire module then a max pooling of the Concat (MNN pooled it differently when the
    pooling's int8 output was on a one-sided grid and its input was float)."""
    def __init__(self):
        super().__init__()
        self.stem, self.squeeze = _cbr(3, 16, stride=2), _cbr(16, 8, 1)
        self.e1, self.e3 = _cbr(8, 16, 1), _cbr(8, 16, 3)
        self.after, self.head = _cbr(32, 16, 1), nn.Conv2d(16, 4, 3, 1, 1)

    def forward(self, x):
        s = self.squeeze(self.stem(x))
        y = torch.cat([self.e1(s), self.e3(s)], 1)
        return self.head(self.after(F.max_pool2d(y, 3, 2, ceil_mode=True)))


class FpnAdd(nn.Module):
    """DBNet's FPN: a sum that feeds a convolution and an upsampling (the upsampling must read the sum
    rounded to the grid MNN stores it on)."""
    def __init__(self):
        super().__init__()
        self.c1, self.c2, self.c3 = _cbr(3, 16, stride=2), _cbr(16, 24, stride=2), _cbr(24, 32, stride=2)
        self.l1, self.l2, self.l3 = nn.Conv2d(16, 16, 1), nn.Conv2d(24, 16, 1), nn.Conv2d(32, 16, 1)
        self.s1, self.s2 = nn.Conv2d(16, 8, 3, 1, 1), nn.Conv2d(16, 8, 3, 1, 1)
        self.head = nn.Conv2d(16, 4, 3, 1, 1)

    def forward(self, x):
        a = self.c1(x)
        b = self.c2(a)
        c = self.c3(b)
        p2 = self.l2(b) + F.interpolate(self.l3(c), scale_factor=2.0, mode="nearest")
        p1 = self.l1(a) + F.interpolate(p2, scale_factor=2.0, mode="nearest")
        fused = torch.cat([self.s1(p1), F.interpolate(self.s2(p2), scale_factor=2.0, mode="nearest")], 1)
        return self.head(fused)


class HardSwishDepthwise(nn.Module):
    """MobileNetV3's stem: hard-swish between int8 convolutions, a depthwise, a residual sum."""
    def __init__(self):
        super().__init__()
        self.stem = _cbr(3, 16, stride=2, act=nn.Hardswish)
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16), nn.ReLU())
        self.pw = nn.Conv2d(16, 16, 1)
        self.out = nn.Conv2d(16, 8, 3, 1, 1)

    def forward(self, x):
        s = self.stem(x)
        return self.out(s + self.pw(self.dw(s)))


class SigmoidTranspose(nn.Module):
    """A segmentation head: transposed convolution, sigmoid gate, concat with a skip."""
    def __init__(self):
        super().__init__()
        self.down, self.mid = _cbr(3, 16, stride=2), _cbr(16, 16)
        self.up = nn.ConvTranspose2d(16, 8, 2, 2)
        self.skip = nn.Conv2d(3, 8, 3, 1, 1)
        self.out = nn.Conv2d(16, 2, 3, 1, 1)

    def forward(self, x):
        m = self.mid(self.down(x))
        u = self.up(m) * torch.sigmoid(self.up(m))
        return self.out(torch.cat([u, self.skip(x)], 1))


class StemPool(nn.Module):
    """ResNet's stem (ReLU) or resnext26ts's (SiLU): a max pooling between int8 convolutions. MNN's x86
    int8 max pooling compares bytes as unsigned: a one-sided grid or a negative value broke it."""
    def __init__(self, act):
        super().__init__()
        self.stem, self.after = _cbr(3, 16, stride=2, act=act), _cbr(16, 16, act=act)
        self.head = nn.Conv2d(16, 4, 3, 1, 1)

    def forward(self, x):
        return self.head(self.after(F.max_pool2d(self.stem(x), 3, 2, 1)))


MODELS = {"relu_maxpool": lambda: StemPool(nn.ReLU), "silu_maxpool": lambda: StemPool(nn.SiLU),
          "concat_maxpool": ConcatPool, "fpn_add_resize": FpnAdd, "hardswish_depthwise": HardSwishDepthwise,
          "sigmoid_convtranspose_concat": SigmoidTranspose}


def _exported(tmp_path, model, shape):
    """The model (seeded, batch norms measured) exported with torch.onnx and converted: (fp32 file, int8
    file path to write)."""
    torch.manual_seed(0)
    m = measure_batchnorm(model(), torch.randn(8, *shape[1:]))
    onnx_path, fp32, int8 = tmp_path / "m.onnx", tmp_path / "m.mnn", tmp_path / "m8.mnn"
    torch.onnx.export(m, (torch.randn(*shape),), str(onnx_path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    api.convert(onnx_path, fp32)
    return fp32, int8


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_int8_file_means_the_same_in_both_runtimes(tmp_path, kind):
    rng = np.random.default_rng(0)
    shape = (1, 3, 48, 64)
    fp32, int8 = _exported(tmp_path, MODELS[kind], shape)
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse"))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    ref = Session(reader.load(fp32)).run(feeds)["y"]
    ours = Session(reader.load(int8)).run(feeds)["y"]
    theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"].reshape(ours.shape)
    assert metrics(ref, theirs)["cosine"] >= 0.99
    agree = metrics(theirs, ours)
    assert agree["cosine"] >= 0.9999, agree


def test_two_workers_write_the_same_file(tmp_path):
    """quant --workers 2 shards calibration over two processes, and --ray local over Ray tasks; the
    statistics merge exactly: the file is the single process's, byte for byte."""
    rng = np.random.default_rng(1)
    shape = (1, 3, 32, 48)
    fp32, _ = _exported(tmp_path, FpnAdd, shape)
    calib = tmp_path / "calib"
    calib.mkdir()
    for k in range(11):
        np.save(calib / f"{k:02d}.npy", (rng.standard_normal(shape) * (1 + k)).astype(np.float32))
    files = {}
    for workers in (1, 2):
        files[workers] = tmp_path / f"w{workers}.mnn"
        quantize_file(fp32, files[workers], QuantConfig(int8=True, calib=str(calib), method="kl", workers=workers))
    assert files[1].read_bytes() == files[2].read_bytes()
    # --auto-skip's candidates evaluated on held-out samples split over the two processes: the same
    # cosines bit for bit, so the same layers kept float and the same file
    reports = {}
    for workers in (1, 2):
        files[workers] = tmp_path / f"a{workers}.mnn"
        reports[workers] = quantize_file(fp32, files[workers], QuantConfig(int8=True, calib=str(calib), method="kl",
                                                                           auto_skip=0.99999, workers=workers))
    assert reports[1]["auto_skipped"] and reports[1]["held_out_samples"] > 1
    assert files[1].read_bytes() == files[2].read_bytes()
    assert [(r["auto_skipped"], r["outputs"], r["layers"]) for r in reports.values()].count(
        (reports[1]["auto_skipped"], reports[1]["outputs"], reports[1]["layers"])) == 2
    files[1] = tmp_path / "w1.mnn"
    pytest.importorskip("ray")      # quant --ray local: the chunks as Ray tasks on a Ray started for the call
    quantize_file(fp32, tmp_path / "ray.mnn", QuantConfig(int8=True, calib=str(calib), method="kl", ray="local"))
    assert (tmp_path / "ray.mnn").read_bytes() == files[1].read_bytes()
    # --auto-skip with --ray: calibration and every candidate's held-out evaluation as Ray tasks
    quantize_file(fp32, tmp_path / "ray_a.mnn", QuantConfig(int8=True, calib=str(calib), method="kl",
                                                             auto_skip=0.99999, ray="local"))
    assert (tmp_path / "ray_a.mnn").read_bytes() == (tmp_path / "a1.mnn").read_bytes()


class DepthwiseRelu(nn.Module):
    """A depthwise convolution with a fused ReLU, so its int8 output is on a one-sided grid (zero point
    -127): MNN folds the bias and that zero point into its accumulator truncated toward zero. It reads
    the graph input, so nothing before it can differ."""
    def __init__(self):
        super().__init__()
        self.dw = nn.Sequential(nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.BatchNorm2d(16), nn.ReLU())
        self.pw = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        return self.pw(self.dw(x))


class PoolFloatInput(nn.Module):
    """Average poolings of float tensors (hard-swish outputs) into int8 convolutions: MNN pools int8
    bytes quantized on the output's grid. Each pool is its input's only reader (a grid MNN would spread
    to other readers is not written: ptq.spread_grids; a squeeze-excite gate stays float: ptq._gates)."""
    def __init__(self):
        super().__init__()
        self.fc, self.side = nn.Conv2d(16, 8, 1), nn.Conv2d(16, 8, 3, 1, 1)

    def forward(self, x):
        g = self.fc(F.avg_pool2d(F.hardswish(3 * x), 2, 2))
        return self.side(F.avg_pool2d(F.hardswish(2 * x), 3, 2, 1, count_include_pad=False)) * g


class GemmChain(nn.Module):
    """Group-1 convolutions feeding each other: a one-sided input grid (after a ReLU), a fused ReLU (a
    one-sided output grid), a 3x3 with padding over 144 channels (an accumulator beyond 2^24, where
    float(D) itself rounds) and a 1x1 with a symmetric output. MNN's int8 GEMM rescales in its own float
    order; one-step differences in a few of 10^5 outputs came from doing it in another."""
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(16, 144, 3, 1, 1)
        self.b = nn.Conv2d(144, 64, 3, 1, 1)
        self.c = nn.Conv2d(64, 96, 1)
        self.head = nn.Conv2d(96, 8, 1)

    def forward(self, x):
        return self.head(self.c(F.relu(self.b(F.relu(self.a(F.relu(x)))))))


class DepthwiseChain(nn.Module):
    """Depthwise layers without and with a fused ReLU, 3x3 and 5x5 stride 2, on 64 channels: MNN runs
    them on an exact integer accumulator with the bias and output zero point folded in truncated, and
    one float32 multiply; a float convolution on the grid rounded 1 of 2*10^5 outputs the other way."""
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(16, 64, 1)
        self.dw1 = nn.Conv2d(64, 64, 3, 1, 1, groups=64)
        self.dw2 = nn.Conv2d(64, 64, 5, 2, 2, groups=64)
        self.pw = nn.Conv2d(64, 32, 1)
        self.head = nn.Conv2d(32, 8, 1)

    def forward(self, x):
        return self.head(self.pw(F.relu(self.dw2(self.dw1(self.a(x))))))


# kind: (model, tensors checked (a name part), least count of them, input shape, seed): the seeds pick
# inputs where the arithmetic of an earlier version rounded some output the other way
LAYERS = {"depthwise_relu": (DepthwiseRelu, "Relu", 1, (1, 16, 48, 64), 0),
          "avgpool_float_input": (PoolFloatInput, "Pool", 2, (1, 16, 48, 64), 0),
          "gemm_chain": (GemmChain, "output", 3, (1, 16, 48, 64), 0),
          "depthwise_chain": (DepthwiseChain, "output", 3, (1, 16, 56, 56), 3)}


@pytest.mark.parametrize("kind", sorted(LAYERS))
def test_int8_layer_rounds_like_mnn(tmp_path, kind):
    """Every int8 value of the layers MNN computes with its own integer arithmetic is the same byte in
    both runtimes (the whole-model cosine above hides a few one-step differences; over 15 layers of
    MobileNetV3 they grew to cosine 0.998). Each tensor is asked of MNN alone: asking for several
    outputs at once changes which of them MNN keeps in int8."""
    model, op, least, shape, seed = LAYERS[kind]
    rng = np.random.default_rng(seed)
    fp32, int8 = _exported(tmp_path, model, shape)
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse"))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    g = reader.load(int8)
    ours = Session(g).run(feeds, keep_all=True)
    checked = 0
    for n in g.nodes:
        t = n.outputs[0]
        q = g.info(t).quant
        if op not in t or q is None:
            continue
        theirs = mnn_run(int8, ["x"], [t], feeds)[t]
        steps = np.abs(theirs - ours[t].reshape(theirs.shape)) / q["scale"]
        assert steps.max() < 0.5, f"{t}: {int((steps >= 0.5).sum())} of {steps.size} values a step apart"
        checked += 1
    assert checked >= least


def test_a_session_gives_each_run_its_own_answer(tmp_path):
    """Tensors the file stores on a grid are rounded by a step of their own: a session run on a second
    input must give what a new session gives (the rounding once read the previous run's values:
    EfficientNet-B0's second image came out at cosine 0.75)."""
    rng = np.random.default_rng(2)
    shape = (1, 3, 32, 48)
    fp32, int8 = _exported(tmp_path, HardSwishDepthwise, shape)
    quantize_file(fp32, int8, QuantConfig(int8=True, method="mse",
                                          calib=[{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]))
    g = reader.load(int8)
    session = Session(g)
    for k in range(3):
        x = {"x": rng.standard_normal(shape).astype(np.float32) * (1 + k)}
        again, fresh = session.run(x)["y"], Session(g).run(x)["y"]
        np.testing.assert_array_equal(again, fresh)


def test_max_pooled_negative_values_stay_float_and_are_reported(tmp_path):
    """The SiLU stem's max pooling sees negative values: the convolution reading it stays float (with
    int8 weights; the stem's own convolution writes the SiLU's input) and the report says why; the
    ReLU stem's pooling keeps int8 on a zero-point-0 grid."""
    rng = np.random.default_rng(0)
    shape = (1, 3, 48, 64)
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(4)]
    for act, floats in ((nn.SiLU, 1), (nn.ReLU, 0)):
        fp32, int8 = _exported(tmp_path, lambda: StemPool(act), shape)
        report = quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse"))
        pooled = [f for f in report["float_layers"] if "max pooling" in f["reason"]]
        assert len(pooled) == floats and all(f["weights"] == "int8" for f in pooled)
        q = reader.load(int8)
        pool = next(n for n in q.nodes if n.op == "Pooling")
        for t in (pool.inputs[0], pool.outputs[0]):
            assert (q.tensors[t].quant is None) == (floats > 0)
            assert q.tensors[t].quant is None or q.tensors[t].quant["zero"] == 0


class FloatReaders(nn.Module):
    """Convolutions of the input whose results only float operators read (a sigmoid gate, a product, a
    sum): int8 input and weights, float output. One with a fused ReLU, one with ReLU6, one 3x3 with none.
    And one reading a SiLU's product, which MNN holds in float: it keeps its int8 output."""
    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Conv2d(16, 32, 1), nn.ReLU())
        self.b = nn.Sequential(nn.Conv2d(16, 32, 3, 1, 1), nn.ReLU6())
        self.c = nn.Conv2d(16, 32, 3, 2, 1)
        self.e, self.d = nn.Conv2d(16, 16, 1), nn.Conv2d(16, 32, 1)

    def forward(self, x):
        a, b = self.a(x), self.b(x)
        return (torch.sigmoid(a) * b + a + F.interpolate(self.c(x), scale_factor=2.0)
                + torch.tanh(self.d(F.silu(self.e(x)))))


def test_int8_convolution_with_a_float_output_computes_what_mnn_does(tmp_path):
    """A convolution whose result no int8 operator reads writes float (symmetricQuan outputDataType
    DT_FLOAT): no output grid, so the output has no rounding for ulp-sized differences to flip. Each
    such output is asked of MNN alone; it reads the graph input, so both runtimes see the same bytes,
    and the two must agree to float precision (1e-5 of the output's largest value), with the
    activation applied. A layer with a float output is one MNN runs as a float layer on its input as
    MNN holds it, so only one reading int8 bytes gets it (not the one after the SiLU, nor a depthwise
    layer)."""
    rng = np.random.default_rng(3)
    shape = (1, 16, 24, 32)
    fp32, int8 = _exported(tmp_path, FloatReaders, shape)
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]
    report = quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse"))
    g = reader.load(int8)
    floats = [n for n in g.nodes if n.param.get("symmetricQuan", {}).get("outputDataType") == "DT_FLOAT"]
    assert len(floats) == 3 and all(g.info(n.outputs[0]).quant is None for n in floats)
    assert report["int8_float_outputs"] == 3 and report["int8_layers"] == 5
    after_silu = next(n for n in g.nodes if n.name.startswith("/d/"))
    assert after_silu.param["symmetricQuan"]["outputDataType"] == "DT_INT8"
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    ours = Session(g).run(feeds, keep_all=True)
    for n in floats:
        t = n.outputs[0]
        theirs = mnn_run(int8, ["x"], [t], feeds)[t]
        mine = ours[t].reshape(theirs.shape)
        assert np.abs(theirs - mine).max() <= 1e-5 * np.abs(theirs).max(), t
        c = n.param["common"]
        assert mine.min() >= 0 if c.get("relu") or c.get("relu6") else mine.min() < 0
        assert mine.max() <= 6 if c.get("relu6") else True
        # not on a grid: the values are not multiples of one step
        step = g.info(n.inputs[0]).quant["scale"]
        assert np.unique(np.round(mine / step, 3) % 1).size > 10
    ref = Session(reader.load(fp32)).run(feeds)["y"]
    theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"]
    assert metrics(ref, theirs)["cosine"] >= 0.999
    assert metrics(theirs, ours["y"])["cosine"] >= 0.99999


class GridActivations(nn.Module):
    """Float operators reading int8 convolutions' outputs, as MobileNetV3 and EfficientNet have them: a
    hard-swish, a SiLU (x * sigmoid(x)) and a sigmoid gate, each read by an int8 convolution."""
    def __init__(self):
        super().__init__()
        self.a, self.b = _cbr(16, 32, act=nn.Hardswish), _cbr(32, 32, act=nn.SiLU)
        self.gate, self.head = nn.Conv2d(32, 32, 1), nn.Conv2d(32, 8, 1)

    def forward(self, x):
        b = self.b(self.a(x))
        return self.head(b * torch.sigmoid(self.gate(b)))


def test_float_operators_on_int8_tensors_compute_mnns_floats(tmp_path):
    """A float operator whose input lies on an int8 grid runs by a table of MNN's own results
    (kernels.ops.mnn_math), so its output is MNN's to the bit (each asked of MNN alone): an ulp of
    difference there flips the next layer's rounding now and then. The SiLU's product has a grid (the
    gate's convolution reads it as int8) but MNN computes it in float, and the gate's product reads it
    unrounded (runtime.session.stored_grids): the outputs then agree to float precision."""
    rng = np.random.default_rng(4)
    shape = (1, 16, 24, 32)
    fp32, int8 = _exported(tmp_path, GridActivations, shape)
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse"))
    g = reader.load(int8)
    producers = g.producers()
    silu = next(n for n in g.nodes if n.op == "UnaryOp" and n.param.get("opType") == "SILU")     # fuse_silu
    assert g.info(silu.outputs[0]).quant is not None
    session = Session(g)
    checked = set()
    for seed in range(2):
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        ours = session.run(feeds, keep_all=True)
        for n in g.nodes:
            src = producers.get(n.inputs[0]) if n.inputs else None
            if n.op != "UnaryOp" or src is None or "symmetricQuan" not in src.param:
                continue
            t = n.outputs[0]
            theirs = mnn_run(int8, ["x"], [t], feeds)[t].reshape(-1)
            mine = ours[t].reshape(-1).astype(np.float32)
            assert np.array_equal(theirs, mine), (t, int((theirs != mine).sum()), theirs.size)
            checked.add(n.param["opType"])
        theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"]
        assert np.abs(theirs - ours["y"].reshape(theirs.shape)).max() <= 1e-5 * np.abs(theirs).max()
    assert checked == {"HARDSWISH", "SIGMOID", "SILU"}


class FloatSkipResidual(nn.Module):
    """Layers kept float (`--skip`: c2, and c4 in "float_sum"). c2's result is read by an int8
    convolution, so the file gives it a grid, and by a residual sum. In "int8_sum" the sum's other
    operand has a grid too: MNN runs that sum on int8 operands, so it reads c2's result rounded. In
    "float_sum" the other operand (c4's result) has none: a float sum in MNN, which reads c2's result
    unrounded (EfficientNet-B0's residual Adds with --auto-skip)."""
    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.c1, self.c2, self.c4 = _cbr(16, 16), nn.Conv2d(16, 16, 1), nn.Conv2d(16, 16, 1)
        self.c3, self.head = nn.Conv2d(16, 16, 3, 1, 1), nn.Conv2d(16, 8, 1)

    def forward(self, x):
        a = self.c1(x)
        b = self.c2(a)
        return self.head(self.c3(b) + (a + b if self.kind == "int8_sum" else b + self.c4(a)))


@pytest.mark.parametrize("kind", ["int8_sum", "float_sum"])
def test_which_readers_see_a_float_layers_output_rounded(tmp_path, kind):
    rng = np.random.default_rng(5)
    shape = (1, 16, 24, 32)
    fp32, int8 = _exported(tmp_path, lambda: FloatSkipResidual(kind), shape)
    kept = tuple(n.name for n in reader.load(fp32).nodes
                 if n.op == "Convolution" and ("c2" in n.name or "c4" in n.name))
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]
    quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse", skip=kept))
    g = reader.load(int8)
    c2 = next(n for n in g.nodes if n.name in kept and "c2" in n.name)
    assert "symmetricQuan" not in c2.param and g.info(c2.outputs[0]).quant is not None
    session = Session(g)
    for _ in range(3):
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"]
        mine = session.run(feeds)["y"].reshape(theirs.shape)
        # c2's float sums round to its grid: where MNN's kernels on this CPU sum in another order, a sum
        # within an ulp of a half step rounds to the other neighbour (seen: 1 of c2's 12288 values on a
        # Zen 4, which reaches 72 of y's 6144 through c3 and head). The wrong reading (rounded for
        # unrounded, or the reverse) moves every sum by up to half a step: most of y.
        off = np.abs(theirs - mine) > 1e-5 * np.abs(theirs).max()
        assert off.mean() <= 0.03, f"{off.mean():.3f} of the outputs differ"


class Mlp(nn.Module):
    """A transformer block's MLP: LayerNorm, Linear, GELU, Linear, residual."""
    def __init__(self):
        super().__init__()
        self.norm, self.fc1, self.fc2 = nn.LayerNorm(32), nn.Linear(32, 128), nn.Linear(128, 32)
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        return self.head(x + self.fc2(F.gelu(self.fc1(self.norm(x)))))


def test_the_linear_after_a_gelu_stays_float_and_is_reported(tmp_path):
    """ptq.float_layers: a Linear reading a GELU's output keeps its compute float (int8 weights), with
    its reason in the report; the Linear before the GELU is int8. Both runtimes agree on the file."""
    rng = np.random.default_rng(6)
    shape = (1, 50, 32)
    torch.manual_seed(0)
    onnx_path, fp32, int8 = tmp_path / "m.onnx", tmp_path / "m.mnn", tmp_path / "m8.mnn"
    torch.onnx.export(Mlp().eval(), (torch.randn(*shape),), str(onnx_path), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"])
    api.convert(onnx_path, fp32)
    samples = [{"x": rng.standard_normal(shape).astype(np.float32)} for _ in range(8)]
    report = quantize_file(fp32, int8, QuantConfig(int8=True, calib=samples, method="mse"))
    reasons = {f["name"]: f["reason"] for f in report["float_layers"]}
    fc2 = [name for name in reasons if "fc2" in name]
    assert len(fc2) == 1 and reasons[fc2[0]] == "reads a GELU's output"
    assert not any("fc1" in name for name in reasons)
    g = reader.load(int8)
    assert any("fc1" in n.name and "symmetricQuan" in n.param for n in g.nodes)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    ours = Session(g).run(feeds)["y"]
    theirs = mnn_run(int8, ["x"], ["y"], feeds)["y"].reshape(ours.shape)
    ref = Session(reader.load(fp32)).run(feeds)["y"]
    assert metrics(ref, theirs)["cosine"] >= 0.999
    assert metrics(theirs, ours)["cosine"] >= 0.9999
