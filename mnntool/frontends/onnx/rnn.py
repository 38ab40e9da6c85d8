"""ONNX LSTM, GRU and RNN -> IR: a sequence length the model fixes is unrolled into MatMul/BinaryOp/
UnaryOp steps; an open one becomes a While loop whose body is one step (rnn_loop.py), so one file runs
any length.

Every op of either form is a primitive that MNN's runtime and ours both run; the input projection for
all time steps is one MatMul, so the per-step work is the recurrent matmul only.
"""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from .math import binary, unary
from .registry import converts


def _dims(ctx, node):
    """(seq, batch, input) of X, each an int or None where the model leaves it open."""
    shape = ctx.shape(node.input[0])
    if shape is None:       # X is [seq, batch, input] by the op's definition
        shape = (None, None, None)
    if len(shape) != 3:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': X must have rank 3, not {len(shape)}")
    if len(node.input) > 4 and node.input[4]:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': sequence_lens is not supported")
    if node.op_type == "LSTM" and len(node.input) > 7 and node.input[7]:
        raise MnnToolError(f"{ctx.path}: LSTM '{node.name}': peepholes are not supported")
    return tuple(d if isinstance(d, int) else None for d in shape)


class _RunTime:
    """A weight computed at run time, indexed like the constant arrays the converters slice (w[d].T,
    r[d, :2H], b[d, :4H] + b[d, 4H:]): each step becomes an op; constants stay numpy arrays."""
    def __init__(self, ctx, name, shape):
        self.ctx, self.name, self.shape = ctx, name, tuple(shape)

    def _emit(self, op, ins, param, shape, tag):
        out = self.ctx.tmp(f"{self.name}_{tag}")
        self.ctx.emit(op, ins, [out], param, out)
        return _RunTime(self.ctx, out, shape)

    def __getitem__(self, idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        c = self.ctx.int_const
        if len(self.shape) == 1:            # a bias row: a range of it
            lo, hi, _ = idx[0].indices(self.shape[0])
            return self._emit("StridedSlice", [self.name, c(f"{self.name}_s", [lo]), c(f"{self.name}_e", [hi]),
                                               c(f"{self.name}_a", [0])], {"fromType": 1}, (hi - lo,), f"r{lo}_{hi}")
        d, rows = idx[0], idx[1] if len(idx) > 1 else slice(None)
        lo, hi, _ = rows.indices(self.shape[1])
        sl = self._emit("StridedSlice", [self.name, c(f"{self.name}_s", [d, lo]), c(f"{self.name}_e", [d + 1, hi]),
                                         c(f"{self.name}_a", [0, 1])], {"fromType": 1},
                        (1, hi - lo) + self.shape[2:], f"d{d}_{lo}_{hi}")
        return sl._emit("Squeeze", [sl.name], {"squeezeDims": [0]}, (hi - lo,) + self.shape[2:], "sq")

    @property
    def T(self):    # noqa: N802 - numpy's name
        return self._emit("Permute", [self.name], {"dims": [1, 0]}, self.shape[::-1], "t")

    def copy(self):
        return self

    def __add__(self, other):
        other = other if isinstance(other, _RunTime) else _RunTime(self.ctx, self.ctx.float_const(
            self.name + "_c", np.asarray(other, np.float32)), np.shape(other))
        return self._emit("BinaryOp", [self.name, other.name], {"opType": "ADD", "T": "DT_FLOAT"}, self.shape, "add")

    __radd__ = __add__


def _tensor(ctx, name, value):
    """A weight operand as a tensor name: a new constant, or the run-time tensor already computed."""
    return value.name if isinstance(value, _RunTime) else ctx.float_const(name, value)


def _tail_zeros(v, n):
    """v followed by n zeros (GRU's input bias: the recurrent bias only for the z and r gates)."""
    if isinstance(v, _RunTime):
        return v._emit("Padding", [v.name, v.ctx.int_const(v.name + "_pz", [0, n])], {"mode": "CONSTANT"},
                       (v.shape[0] + n,), "pad")
    return np.concatenate([v, np.zeros(n, v.dtype)])


def _weights(ctx, node, a, gates: int):
    """(seq, batch, hidden, W, R, B, directions) with B zero when absent; constants as arrays, run-time
    weights as _RunTime."""
    seq, batch, _ = _dims(ctx, node)
    hidden = int(a["hidden_size"])

    def operand(k, what):
        v = ctx.const(node.input[k])
        if v is not None:
            return v
        shape = ctx.shape(node.input[k])
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': {what} has an unknown shape")
        return _RunTime(ctx, node.input[k], shape)
    w, r = operand(1, "W"), operand(2, "R")
    dirs = w.shape[0]
    b = np.zeros((dirs, 2 * gates * hidden), np.float32)
    if len(node.input) > 3 and node.input[3]:
        b = operand(3, "B")
    return seq, batch, hidden, w, r, b, dirs


def _direction(a):
    d = a.get("direction", b"forward")
    return d.decode() if isinstance(d, bytes) else d


def _slice0(ctx, x, t, out, name):
    ins = [x] + [ctx.int_const(f"{name}_{k}", [v]) for k, v in (("s", t), ("e", t + 1), ("a", 0))]
    ctx.emit("StridedSlice", ins, [out], {"fromType": 1}, name)


def _initial(ctx, node, k, d, batch, hidden, label):
    if len(node.input) > k and node.input[k]:
        v = ctx.const(node.input[k])
        if v is not None:
            return ctx.float_const(f"{node.name}_{label}{d}", v[d:d + 1])
        out = ctx.tmp(f"{node.name}_{label}{d}")
        _slice0(ctx, node.input[k], d, out, out)
        return out
    if batch is not None:
        return ctx.float_const(f"{node.name}_{label}0_{d}", np.zeros((1, batch, hidden), np.float32))
    # zeros [1, batch, hidden] with the batch of X at run time
    base = f"{node.name}_{label}0_{d}"
    shp, b, dims, out = (ctx.tmp(base + s_) for s_ in ("_xshape", "_batch", "_dims", ""))
    ctx.emit("Shape", [node.input[0]], [shp], {}, shp, fmt="NCHW")
    ctx.emit("GatherV2", [shp, ctx.int_const(base + "_bi", [1]), ctx.int_const(base + "_ba", [0])], [b], {}, b)
    ctx.emit("Concat", [ctx.int_const(base + "_one", [1]), b, ctx.int_const(base + "_h", [hidden])], [dims],
             {"axis": 0}, dims)
    ctx.emit("Fill", [dims, ctx.g.add_const(base + "_zero", np.array(0, np.float32))], [out], {}, out)
    return out


def _input_projection(ctx, node, d, w, b_in, prefix):
    """X @ W^T + bias for all steps at once: [seq, batch, G*H]."""
    xw = ctx.tmp(prefix + "_xw")
    ctx.emit("MatMul", [node.input[0], _tensor(ctx, prefix + "_W", w[d].T.copy())], [xw],
             {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}, prefix + "_xw")
    xb = ctx.tmp(prefix + "_xb")
    binary(ctx, xw, _tensor(ctx, prefix + "_b", b_in), xb, "ADD", prefix + "_xb")
    return xb


def _split(ctx, x, n, hidden, prefix):
    outs = [ctx.tmp(f"{prefix}_g{i}") for i in range(n)]
    ctx.emit("Slice", [x], outs, {"axis": 2, "slicePoints": [hidden * i for i in range(1, n)],
                                  "sourceType": "CAFFE"}, prefix + "_split")
    return outs


def _finish(ctx, node, per_dir_steps, per_dir_last, extra_last=None):
    """Y [seq, dirs, batch, H], Y_h [dirs, batch, H] (and Y_c)."""
    ys = []
    for d, steps in enumerate(per_dir_steps):
        y = ctx.tmp(f"{node.name}_y{d}")
        ctx.emit("Concat", steps, [y], {"axis": 0}, f"{node.name}_y{d}") if len(steps) > 1 else \
            ctx.emit("Identity", steps, [y], {}, f"{node.name}_y{d}")
        yu = ctx.tmp(f"{node.name}_yu{d}")
        ctx.emit("Unsqueeze", [y], [yu], {"squeezeDims": [1]}, f"{node.name}_yu{d}")
        ys.append(yu)

    def join(parts, out, axis, label):
        if len(parts) == 1:
            ctx.emit("Identity", parts, [out], {}, f"{node.name}_{label}")
        else:
            ctx.emit("Concat", parts, [out], {"axis": axis}, f"{node.name}_{label}")
    outputs = list(node.output) + [""] * 3
    if outputs[0]:
        join(ys, outputs[0], 1, "Y")
    if outputs[1]:
        join(per_dir_last, outputs[1], 0, "Y_h")
    if extra_last is not None and outputs[2]:
        join(extra_last, outputs[2], 0, "Y_c")


MM = {"T": "DT_FLOAT", "transposeA": False, "transposeB": False}


def _lstm_step(ctx, q, xt, state, k):
    """One LSTM step from x_t's projection [1, B, 4H]; state (h, c); k: the step's constants by role."""
    h, c = state
    hr, gates = ctx.tmp(q + "_hr"), ctx.tmp(q + "_gates")
    ctx.emit("MatMul", [h, k["R"]], [hr], MM, q + "_hr")
    binary(ctx, xt, hr, gates, "ADD", q + "_gates")
    gi, go, gf, gc = _split(ctx, gates, 4, k["hidden"], q)
    i, o, f, cc = (ctx.tmp(q + s) for s in ("_i", "_o", "_f", "_cc"))
    unary(ctx, gi, i, "SIGMOID", q + "_i")
    unary(ctx, go, o, "SIGMOID", q + "_o")
    unary(ctx, gf, f, "SIGMOID", q + "_f")
    unary(ctx, gc, cc, "TANH", q + "_cc")
    fc, ic, c_new, tc, h_new = (ctx.tmp(q + s) for s in ("_fc", "_ic", "_c", "_tc", "_h"))
    binary(ctx, f, c, fc, "MUL", q + "_fc")
    binary(ctx, i, cc, ic, "MUL", q + "_ic")
    binary(ctx, fc, ic, c_new, "ADD", q + "_c")
    unary(ctx, c_new, tc, "TANH", q + "_tc")
    binary(ctx, o, tc, h_new, "MUL", q + "_h")
    return h_new, c_new


def _gru_step(ctx, q, xt, state, k):
    (h,) = state
    hidden = k["hidden"]
    xz, xr, xn = _split(ctx, xt, 3, hidden, q + "_xs")
    hzr, zs, rs = ctx.tmp(q + "_hzr"), ctx.tmp(q + "_zs"), ctx.tmp(q + "_rs")
    ctx.emit("MatMul", [h, k["Rzr"]], [hzr], MM, q + "_hzr")
    hz, hr = _split(ctx, hzr, 2, hidden, q + "_hs")
    binary(ctx, xz, hz, zs, "ADD", q + "_zs")
    binary(ctx, xr, hr, rs, "ADD", q + "_rs")
    z, rg = ctx.tmp(q + "_z"), ctx.tmp(q + "_r")
    unary(ctx, zs, z, "SIGMOID", q + "_z")
    unary(ctx, rs, rg, "SIGMOID", q + "_r")
    hn, hnb, rhn, ns, n = (ctx.tmp(q + s) for s in ("_hn", "_hnb", "_rhn", "_ns", "_n"))
    if k["lbr"]:
        ctx.emit("MatMul", [h, k["Rh"]], [hn], MM, q + "_hn")
        binary(ctx, hn, k["Rbh"], hnb, "ADD", q + "_hnb")
        binary(ctx, rg, hnb, rhn, "MUL", q + "_rhn")
    else:
        rh = ctx.tmp(q + "_rh")
        binary(ctx, rg, h, rh, "MUL", q + "_rh")
        ctx.emit("MatMul", [rh, k["Rh"]], [hn], MM, q + "_hn")
        binary(ctx, hn, k["Rbh"], rhn, "ADD", q + "_rhn")
    binary(ctx, xn, rhn, ns, "ADD", q + "_ns")
    unary(ctx, ns, n, "TANH", q + "_n")
    hmn, zh, h_new = ctx.tmp(q + "_hmn"), ctx.tmp(q + "_zh"), ctx.tmp(q + "_h")
    binary(ctx, h, n, hmn, "SUB", q + "_hmn")
    binary(ctx, z, hmn, zh, "MUL", q + "_zh")
    binary(ctx, n, zh, h_new, "ADD", q + "_h")
    return (h_new,)


def _rnn_step(ctx, q, xt, state, k):
    """h_t = tanh(x_t W^T + h_{t-1} R^T + Wb + Rb)."""
    (h,) = state
    hr, pre, h_new = ctx.tmp(q + "_hr"), ctx.tmp(q + "_pre"), ctx.tmp(q + "_h")
    ctx.emit("MatMul", [h, k["R"]], [hr], MM, q + "_hr")
    binary(ctx, xt, hr, pre, "ADD", q + "_pre")
    unary(ctx, pre, h_new, "TANH", q + "_h")
    return (h_new,)


def _unrolled(ctx, seq, xb, state, step, consts, p, reverse):
    """The steps one after another in the graph (a sequence length the model fixes): [h_t per t], state."""
    outs = {}
    k = consts(ctx, p)
    for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
        q = f"{p}_t{t}"
        xt = ctx.tmp(q + "_x")
        _slice0(ctx, xb, t, xt, q + "_x")
        state = step(ctx, q, xt, state, k)
        outs[t] = state[0]
    return [outs[t] for t in range(seq)], state


def _run(ctx, node, seq, xb, state, step, consts, p, reverse):
    if isinstance(seq, int):
        return _unrolled(ctx, seq, xb, state, step, consts, p, reverse)
    from .rnn_loop import looped
    return looped(ctx, node, xb, state, step, consts, p, reverse)


def _check(ctx, node, a, dirs, acts):
    if a.get("activations") not in (None, acts * dirs) or a.get("clip") or a.get("layout", 0) or \
            a.get("input_forget"):
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': custom activations/clip/layout are not supported")


def _reversed(a, d) -> bool:
    direction = _direction(a)
    return direction == "reverse" or (direction == "bidirectional" and d == 1)


@converts("LSTM")
def lstm(ctx, node, a):
    seq, batch, hidden, w, r, b, dirs = _weights(ctx, node, a, 4)
    _check(ctx, node, a, dirs, [b"Sigmoid", b"Tanh", b"Tanh"])
    all_steps, all_h, all_c = [], [], []
    for d in range(dirs):
        p = f"{node.name}_d{d}"
        xb = _input_projection(ctx, node, d, w, b[d, :4 * hidden] + b[d, 4 * hidden:], p)
        rt = r[d].T.copy()
        state = (_initial(ctx, node, 5, d, batch, hidden, "h"), _initial(ctx, node, 6, d, batch, hidden, "c"))
        steps, (h, c) = _run(ctx, node, seq, xb, state, _lstm_step,
                             lambda cx, q: {"R": _tensor(cx, p + "_R", rt), "hidden": hidden}, p, _reversed(a, d))
        all_steps.append(steps)
        all_h.append(h)
        all_c.append(c)
    _finish(ctx, node, all_steps, all_h, all_c)


@converts("GRU")
def gru(ctx, node, a):
    seq, batch, hidden, w, r, b, dirs = _weights(ctx, node, a, 3)
    _check(ctx, node, a, dirs, [b"Sigmoid", b"Tanh"])
    lbr = bool(a.get("linear_before_reset", 0))
    all_steps, all_h = [], []
    for d in range(dirs):
        p = f"{node.name}_d{d}"
        wb, rb = b[d, :3 * hidden], b[d, 3 * hidden:]
        xb = _input_projection(ctx, node, d, w, wb + _tail_zeros(rb[:2 * hidden], hidden), p)
        r_zr, r_h, rb_h = r[d, :2 * hidden].T.copy(), r[d, 2 * hidden:].T.copy(), rb[2 * hidden:].copy()

        def consts(cx, q):
            return {"Rzr": _tensor(cx, p + "_Rzr", r_zr), "Rh": _tensor(cx, p + "_Rh", r_h),
                    "Rbh": _tensor(cx, p + "_Rbh", rb_h), "hidden": hidden, "lbr": lbr}
        state = (_initial(ctx, node, 5, d, batch, hidden, "h"),)
        steps, (h,) = _run(ctx, node, seq, xb, state, _gru_step, consts, p, _reversed(a, d))
        all_steps.append(steps)
        all_h.append(h)
    _finish(ctx, node, all_steps, all_h)


@converts("RNN")
def rnn(ctx, node, a):
    seq, batch, hidden, w, r, b, dirs = _weights(ctx, node, a, 1)
    _check(ctx, node, a, dirs, [b"Tanh"])
    all_steps, all_h = [], []
    for d in range(dirs):
        p = f"{node.name}_d{d}"
        xb = _input_projection(ctx, node, d, w, b[d, :hidden] + b[d, hidden:], p)
        rt = r[d].T.copy()
        state = (_initial(ctx, node, 5, d, batch, hidden, "h"),)
        steps, (h,) = _run(ctx, node, seq, xb, state, _rnn_step,
                           lambda cx, q: {"R": _tensor(cx, p + "_R", rt), "hidden": hidden}, p, _reversed(a, d))
        all_steps.append(steps)
        all_h.append(h)
    _finish(ctx, node, all_steps, all_h)
