"""Models made with torch.jit.script (not traced): the ops scripting leaves for a module's state
(prim::SetAttr), optional values (prim::Uninitialized), membership tests (aten::__contains__) and device
checks (prim::device), lowered to their values at conversion; the converted model is the scripted
module's first call on a fresh instance. One module per op (the frozen, inlined graph checked to hold it),
converted and run in mnntool's runtime and MNN against eager torch: cosine >= 0.9999 and max abs <= 1e-3
x the output's scale. A value these ops cannot know at conversion is refused in one line."""
import math
from typing import Dict, List, Union

import pytest

torch = pytest.importorskip("torch")

import mnntool  # noqa: E402
from mnntool import api  # noqa: E402
from mnntool.errors import MnnToolError  # noqa: E402
from tests.conftest import assert_close, mnn_run  # noqa: E402
from tests.test_cli import assert_one_line_error, run  # noqa: E402

nn = torch.nn


class Contains(nn.Module):
    """Picks its branch by whether the input's width is one it knows (silero-vad checks sample rates so)."""
    def __init__(self):
        super().__init__()
        self.widths: List[int] = [256, 512]

    def forward(self, x):
        if x.size(-1) in self.widths:
            return torch.tanh(x) * 2.0
        return x


class SetAttr(nn.Module):
    """Keeps a context between calls, empty before the first (silero-vad's _context)."""
    def __init__(self):
        super().__init__()
        self._context = torch.zeros(0)
        self.calls = 0

    def forward(self, x):
        if self._context.numel() == 0:
            self._context = torch.ones(x.size(0), 4) * 0.5
        self.calls = self.calls + 1
        y = torch.cat([self._context, x], 1) * float(self.calls)
        self._context = y[:, -4:]
        return y + self._context.sum()


class Uninitialized(nn.Module):
    """A value defined only on the branch that does not raise (scripting fills the other with a placeholder)."""
    def forward(self, x):
        if x.dim() == 2:
            y = x * 3.0
        else:
            raise ValueError("expects [batch, samples]")
        return torch.relu(y)


class Device(nn.Module):
    """A state tensor made on the input's device."""
    def forward(self, x):
        h = torch.zeros(x.size(0), 3, device=x.device) + 1.5
        return torch.cat([h.to(x.device), x], 1)


class PythonValues(nn.Module):
    """Scripted code's own values: lists grown and sliced, a dict cache written and read, strings, integer
    math on sizes and isinstance on an open type (timm's DenseNet, LeViT and MobileViT script to these)."""
    cache: Dict[str, torch.Tensor]

    def __init__(self):
        super().__init__()
        self.cache = {}

    def forward(self, x):
        parts: List[torch.Tensor] = [x]
        for k in range(3):
            parts.append(parts[-1] * 0.5 + float(k))
        feats: Union[torch.Tensor, List[torch.Tensor]] = parts
        if isinstance(feats, torch.Tensor):
            return feats
        key = str(x.size(1) // 128) + "x"
        if key not in self.cache:
            self.cache[key] = torch.ones(1, x.size(1)) * 0.25
        h = int(math.ceil(x.size(1) / 100.0))
        last = list(parts[-2:])
        return torch.cat(last, 0)[:, :h * 100] + self.cache[key][:, :h * 100]


class LSTMCell(nn.Module):
    """One recurrent step from a zero state (silero-vad's decoder; tracing would decompose the cell)."""
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.cell = nn.LSTMCell(512, 16)

    def forward(self, x):
        h, c = self.cell(x)
        h2, c2 = self.cell(x * 0.5, (h, c))
        return torch.cat([h2, c2], 1)


CASES = {"aten::__contains__": Contains, "prim::SetAttr": SetAttr, "prim::Uninitialized": Uninitialized,
         "prim::device": Device, "aten::append": PythonValues,
         "aten::lstm_cell": LSTMCell}


def _kinds(module) -> set:
    """The ops of the graph the frontend walks (frozen where freezing applies, inlined), blocks included."""
    try:
        module = torch.jit.freeze(module.eval())
    except Exception:   # noqa: BLE001 - as the frontend: a module whose state is set is not frozen
        pass
    g = module.graph.copy()
    torch._C._jit_pass_inline(g)
    found = set()

    def scan(block):
        for n in block.nodes():
            found.add(n.kind())
            for b in n.blocks():
                scan(b)
    scan(g)
    return found


def _convert(tmp_path, module, x):
    scripted = torch.jit.script(module)
    src, dst = tmp_path / "m.pt", tmp_path / "m.mnn"
    scripted.save(str(src))
    api.convert(src, dst, input_shapes={"x": tuple(x.shape)})
    return torch.jit.load(str(src)), dst


@pytest.mark.parametrize("op", sorted(CASES))
def test_scripted_op_matches_torch_in_both_runtimes(tmp_path, op):
    x = torch.randn(2, 512, generator=torch.Generator().manual_seed(5))
    loaded, dst = _convert(tmp_path, CASES[op](), x)
    assert op in _kinds(torch.jit.load(str(tmp_path / "m.pt"))), sorted(_kinds(loaded))
    ref = CASES[op]().eval()(x).detach().numpy()       # the first call of a fresh instance (same seed)
    g = api.load_graph(dst)
    feeds = {"x": x.numpy()}
    assert_close(ref, mnntool.load(dst).run(feeds)[g.outputs[0]])
    assert_close(ref, mnn_run(dst, ["x"], [g.outputs[0]], feeds)[g.outputs[0]])


class StateByData(nn.Module):
    """State set on a branch the data chooses: its value after the call is not known at conversion."""
    def __init__(self):
        super().__init__()
        self.last = torch.zeros(1)

    def forward(self, x):
        if bool(x.sum() > 0):
            self.last = x.sum().reshape(1)
        return x * self.last


def test_unknown_state_and_plain_inputs_refused_in_one_line(tmp_path):
    scripted = torch.jit.script(StateByData())
    src = tmp_path / "s.pt"
    scripted.save(str(src))
    out = tmp_path / "s.mnn"
    assert_one_line_error(*run("convert", src, out, "--input-shape", "x:2x5"), "prim::SetAttr")
    assert not out.exists()

    class TwoArgs(nn.Module):
        def forward(self, x, rate: int):
            return x * float(rate)
    torch.jit.script(TwoArgs()).save(str(tmp_path / "t.pt"))
    with pytest.raises(MnnToolError, match="rate") as e:
        api.convert(tmp_path / "t.pt", out, input_shapes={"x": (2, 5)})
    assert "not tensors" in str(e.value) and "\n" not in str(e.value)
