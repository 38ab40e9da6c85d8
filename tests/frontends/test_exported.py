"""torch.export programs (.pt2) and TorchScript traces of transformer-style models, converted and run in
both runtimes against eager torch; a .pt2 whose weights hide a pickled object is refused without
running it.

Reference: eager torch on the same module. Tolerance: max abs error 1e-4 (float32, same op order up to
the MatMul blocking).
"""
import contextlib
import io
import json
import zipfile

import numpy as np
import pytest

from mnntool import api
from mnntool.errors import MnnToolError
from mnntool.runtime.session import Session

torch = pytest.importorskip("torch")


def _decoder_inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 97, (1, 3), generator=gen), torch.randn(2, 1, 4, 5, 16, generator=gen),
            torch.randn(2, 1, 4, 5, 16, generator=gen))


class Mixed(torch.nn.Module):
    """Conv, group norm, hardsigmoid, 1-D conv, upsampling, expand/unbind/stack and a causal SDPA."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding="same")
        self.gn = torch.nn.GroupNorm(2, 8)
        self.conv1d = torch.nn.Conv1d(8, 8, 5, stride=2, padding=2)
        self.qkv = torch.nn.Linear(8, 24)

    def forward(self, x):
        y = torch.nn.functional.hardsigmoid(self.gn(self.conv(x)))
        y = torch.nn.functional.interpolate(y, scale_factor=2.0, mode="bilinear", align_corners=False)
        seq = self.conv1d(y.flatten(2))                        # [N, 8, L]
        q, k, v = self.qkv(seq.transpose(1, 2)).unflatten(-1, (3, 2, 4)).permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        pos = torch.arange(a.shape[2]).float()[None, None, :, None].expand(a.shape)
        return torch.stack([a, a + pos], dim=1).flatten(1).cumsum(-1)


def _check(path, model, args, names, outs, tmp_path):
    from mnntool.runtime.mnn_backend import MnnSession
    dst = tmp_path / (path.name + ".mnn")
    api.convert(path, dst, input_shapes={n: tuple(a.shape) for n, a in zip(names, args)} if path.suffix == ".pt" else None)
    g = api.load_graph(dst)
    with torch.no_grad():
        ref = model(*args)
    ref = [r.numpy() for r in (ref if isinstance(ref, tuple) else (ref,))]
    feeds = {n: a.numpy() for n, a in zip(g.inputs, args)}
    for got in (Session(g).run(feeds), MnnSession(str(dst), g.inputs, g.outputs).run(feeds)):
        for o, r in zip(g.outputs, ref):
            np.testing.assert_allclose(got[o], r, atol=1e-4, rtol=1e-4)


def test_exported_program_decoder_and_mixed_ops(tmp_path):
    from fixtures.decoder import DecoderStep
    torch.manual_seed(0)
    dec = DecoderStep().eval()
    args = _decoder_inputs()
    torch.export.save(torch.export.export(dec, args), str(tmp_path / "dec.pt2"))
    _check(tmp_path / "dec.pt2", dec, args, ["ids", "past_k", "past_v"], 3, tmp_path)
    mixed = Mixed().eval()
    x = (torch.randn(1, 3, 8, 8),)
    torch.export.save(torch.export.export(mixed, x), str(tmp_path / "mixed.pt2"))
    _check(tmp_path / "mixed.pt2", mixed, x, ["x"], 1, tmp_path)


def test_torchscript_trace_of_the_same_models(tmp_path):
    from fixtures.decoder import DecoderStep
    torch.manual_seed(0)
    dec = DecoderStep().eval()
    args = _decoder_inputs()
    with contextlib.redirect_stderr(io.StringIO()):
        torch.jit.save(torch.jit.trace(dec, args, check_trace=False), str(tmp_path / "dec.pt"))
    _check(tmp_path / "dec.pt", dec, args, ["ids", "past_k", "past_v"], 3, tmp_path)
    mixed = Mixed().eval()
    x = (torch.randn(1, 3, 8, 8),)
    torch.jit.save(torch.jit.trace(mixed, x, check_trace=False), str(tmp_path / "mixed.pt"))
    _check(tmp_path / "mixed.pt", mixed, x, ["x"], 1, tmp_path)


class _Marker:
    path = ""

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickled_object_in_a_pt2_is_refused_unrun(tmp_path):
    import pickle
    m = torch.nn.Linear(4, 2)
    good = tmp_path / "good.pt2"
    torch.export.save(torch.export.export(m, (torch.randn(1, 4),)), str(good))
    marker = tmp_path / "ran"
    _Marker.path = str(marker)
    bad = tmp_path / "bad.pt2"
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("model_weights_config.json"):
                cfg = json.loads(data)
                first = next(iter(cfg["config"].values()))
                first["use_pickle"] = True
                victim = first["path_name"]
                data = json.dumps(cfg).encode()
            zout.writestr(item, data)
    with zipfile.ZipFile(bad) as z:
        names = z.namelist()
    target = next(n for n in names if n.endswith("/" + victim))
    with zipfile.ZipFile(good) as zin, zipfile.ZipFile(tmp_path / "bad2.pt2", "w") as zout, zipfile.ZipFile(bad) as zb:
        for item in zb.infolist():
            zout.writestr(item, pickle.dumps(_Marker()) if item.filename == target else zb.read(item.filename))
    with pytest.raises(MnnToolError) as e:
        api.convert(tmp_path / "bad2.pt2", tmp_path / "bad.mnn")
    assert "\n" not in str(e.value)
    assert not marker.exists(), "converting ran code from the file"
    assert not (tmp_path / "bad.mnn").exists()


@pytest.mark.parametrize("suffix", [".pt2", ".pt"])
def test_verify_against_eager_torch_layer_by_layer(tmp_path, suffix):
    """verify runs the program (or trace) in torch and compares every tensor whose name maps; a .mnn made
    from other weights fails at the first layer those weights touch."""
    from mnntool.verifier import verify

    def save(seed, path):
        torch.manual_seed(seed)
        m = Mixed().eval()
        x = (torch.randn(1, 3, 8, 8),)
        if suffix == ".pt2":
            torch.export.save(torch.export.export(m, x), str(path))
        else:
            torch.jit.save(torch.jit.trace(m, x, check_trace=False), str(path))
    good, other = tmp_path / f"good{suffix}", tmp_path / f"other{suffix}"
    save(0, good)
    save(1, other)
    shapes = {"x": (1, 3, 8, 8)} if suffix == ".pt" else None
    api.convert(good, tmp_path / "good.mnn", input_shapes=shapes)
    r = verify(good, tmp_path / "good.mnn", shapes=shapes)
    assert r["pass"] and len(r["layers"]) >= 8 and all(m["pass"] for m in r["layers"])
    bad = verify(other, tmp_path / "good.mnn", shapes=shapes)
    failing = [m["name"] for m in bad["layers"] if not m["pass"]]
    # the output itself may still match (this model's arange term dominates it): the layers do not
    assert bad["first_failing"] == failing[0] and len(failing) >= 5
    names = [m["name"] for m in bad["layers"]]
    assert names.index(failing[0]) <= 1, f"the first layers (the convolution's) differ first: {failing[:3]}"


class Scripted(torch.nn.Module):
    """Control flow on run-time values, as torch.jit.script keeps it."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, n: torch.Tensor):
        if x.sum() > 0:
            y = self.lin(x) * 2.0
        else:
            y = -x
        acc = y
        for _ in range(int(n)):         # a trip count from an input: a While loop
            acc = torch.tanh(self.lin(acc)) + y
        for _ in range(3):              # a known count: unrolled
            acc = acc * 0.5
        return acc


def test_scripted_if_and_loop_on_run_time_values(tmp_path):
    from mnntool.runtime.mnn_backend import MnnSession
    torch.manual_seed(0)
    m = torch.jit.script(Scripted().eval())
    torch.jit.save(m, str(tmp_path / "s.pt"))
    api.convert(tmp_path / "s.pt", tmp_path / "s.mnn", input_shapes={"x": (2, 4), "n": ()})
    g = api.load_graph(tmp_path / "s.mnn")
    assert {"If", "While"} <= {n.op for n in g.nodes}
    ours, theirs = Session(g), MnnSession(str(tmp_path / "s.mnn"), g.inputs, g.outputs)
    rng = np.random.RandomState(0)
    for sign in (1, -1):
        for n in (0, 1, 5):
            x = sign * np.abs(rng.randn(2, 4)).astype(np.float32)
            with torch.no_grad():
                ref = m(torch.from_numpy(x), torch.tensor(n)).numpy()
            feeds = {"x": x, "n": np.array(n, np.int32)}
            for got in (ours.run(feeds), theirs.run(feeds)):
                np.testing.assert_allclose(got[g.outputs[0]], ref, atol=1e-5)


def test_program_with_open_dims_keeps_them(tmp_path):
    """torch.export's Dim left open: the .mnn keeps the dims open and runs two sizes; --input-shape fixes
    them instead (then the aten converters run)."""
    from mnntool.runtime.mnn_backend import MnnSession
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.SiLU(),
                            torch.nn.Conv2d(8, 16, 3, stride=2, padding=1), torch.nn.AdaptiveAvgPool2d(1),
                            torch.nn.Flatten(), torch.nn.Linear(16, 5)).eval()
    h, w = torch.export.Dim("h", min=8, max=512), torch.export.Dim("w", min=8, max=512)
    ep = torch.export.export(m, (torch.randn(2, 3, 32, 40),), dynamic_shapes=({2: h, 3: w},))
    torch.export.save(ep, str(tmp_path / "cnn.pt2"))
    api.convert(tmp_path / "cnn.pt2", tmp_path / "open.mnn")
    g = api.load_graph(tmp_path / "open.mnn")
    name = g.inputs[0]
    assert g.tensors[name].shape[:2] == (2, 3) and not any(isinstance(d, int) for d in g.tensors[name].shape[2:])
    ours, theirs = Session(g), MnnSession(str(tmp_path / "open.mnn"), g.inputs, g.outputs)
    for shape in ((2, 3, 32, 40), (2, 3, 17, 64)):
        x = torch.randn(*shape)
        with torch.no_grad():
            ref = m(x).numpy()
        for got in (ours.run({name: x.numpy()}), theirs.run({name: x.numpy()})):
            np.testing.assert_allclose(got[g.outputs[0]], ref, atol=1e-4)
    api.convert(tmp_path / "cnn.pt2", tmp_path / "fixed.mnn", input_shapes={name: (2, 3, 24, 24)})
    assert api.load_graph(tmp_path / "fixed.mnn").tensors[name].shape == (2, 3, 24, 24)


@pytest.mark.parametrize("kind,suffix", [("LSTM", ".pt"), ("GRU", ".pt"), ("LSTM", ".pt2"), ("GRU", ".pt2")])
def test_aten_lstm_and_gru_with_state_inputs(tmp_path, kind, suffix):
    """Two bidirectional batch-first layers whose initial states are model inputs (streaming: the final
    states come out as outputs)."""
    torch.manual_seed(0)
    from tests.frontends.test_recurrent_any_length import Cell
    m = Cell(kind, True, layers=2, batch_first=True).eval()
    args = (torch.randn(2, 5, 8), torch.randn(4, 2, 16), torch.randn(4, 2, 16))[:3 if kind == "LSTM" else 2]
    path = tmp_path / f"r{suffix}"
    if suffix == ".pt":
        torch.jit.save(torch.jit.trace(m, args), str(path))
    else:
        torch.export.save(torch.export.export(m, args), str(path))
    _check(path, m, args, ["x", "h0", "c0"][:len(args)], len(args), tmp_path)
