"""Runs of small elementwise ops executed as one program in one Numba call.

An unrolled LSTM does ten ops on 64 floats per time step (the gates' add and split, three sigmoids
and a tanh, the cell update, its tanh, the output): each costs about 1 us of Python and dispatch
around 0.05 us of arithmetic. Consecutive ops of that kind (float32, at most LIMIT elements, no int8
grid) become one step: their tensors live in one float32 arena (a Slice's pieces are ranges of their
input's region, no copy), inputs from outside are copied in by LOAD instructions, and `execute`
interprets the instructions. The arena is never reused, so every tensor stays readable by later
steps and by `keep_all`.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from . import Kernel, aligned_empty
from .tensor import split_bounds

LIMIT = 16384       # elements: larger tensors keep their own (vectorized, parallel) kernels
EXTERNAL = 4        # inputs from outside one program: one argument each
ALIGN = 16          # floats: each tensor's region starts on a cache line

LOAD, SIGMOID, TANH, RELU, NEG, EXP, ABS, ADD, SUB, MUL, DIV, MAX, MIN = range(13)
SPLIT = -1          # a Slice: no instruction, its pieces are ranges of the input's region
UNARY = {"SIGMOID": SIGMOID, "TANH": TANH, "NEG": NEG, "EXP": EXP, "ABS": ABS}
OP_TYPES = {"Sigmoid": SIGMOID, "TanH": TANH, "ReLU": RELU}
BINARY = {"ADD": ADD, "SUB": SUB, "MUL": MUL, "REALDIV": DIV, "DIV": DIV, "MAXIMUM": MAX, "MINIMUM": MIN}


@njit(cache=True, inline="always")
def _sigmoid(v):
    one = np.float32(1)
    if v >= 0:
        return one / (one + np.exp(-v))
    e = np.exp(v)
    return e / (one + e)


@njit(cache=True, inline="always")
def _tanh(v):
    """1 - 2 / (e^2|v| + 1) with v's sign: an exp (3 ns) where libm's tanhf takes 11 ns here; within
    1.2e-7 of it. |v| is clamped at 9, where tanh is 1 in float32, so the exp stays finite."""
    u = min(abs(v), np.float32(9))
    t = np.float32(1) - np.float32(2) / (np.exp(np.float32(2) * u) + np.float32(1))
    return t if v >= 0 else -t


@njit(cache=True, fastmath=True)
def execute(prog, arena, e0, e1, e2, e3):
    """Rows (code, dst, a, b, n, a_step, b_step, relu): LOAD copies external a's n floats to dst; a
    unary op maps arena[a:a+n]; a binary op combines arena[a + i*a_step] and arena[b + i*b_step] (a
    step of 0 broadcasts one value), then max(., 0) when relu. One loop per op (the op chosen outside
    it), so each is a plain loop LLVM can vectorize."""
    zero = np.float32(0)
    for r in range(prog.shape[0]):
        code, dst, a, b, n = prog[r, 0], prog[r, 1], prog[r, 2], prog[r, 3], prog[r, 4]
        y = arena[dst:dst + n]
        if code == LOAD:
            src = e0 if a == 0 else e1 if a == 1 else e2 if a == 2 else e3
            y[:] = src[:n]
            continue
        if code < ADD:
            x = arena[a:a + n]
            if code == SIGMOID:
                for i in range(n):
                    y[i] = _sigmoid(x[i])
            elif code == TANH:
                for i in range(n):
                    y[i] = _tanh(x[i])
            elif code == RELU:
                for i in range(n):
                    y[i] = max(x[i], zero)
            elif code == NEG:
                for i in range(n):
                    y[i] = -x[i]
            elif code == EXP:
                for i in range(n):
                    y[i] = np.exp(x[i])
            else:
                for i in range(n):
                    y[i] = abs(x[i])
            continue
        sa, sb, relu = prog[r, 5], prog[r, 6], prog[r, 7]
        if sa == 1 and sb == 1:
            p, q = arena[a:a + n], arena[b:b + n]
            if code == ADD:
                for i in range(n):
                    y[i] = p[i] + q[i]
            elif code == SUB:
                for i in range(n):
                    y[i] = p[i] - q[i]
            elif code == MUL:
                for i in range(n):
                    y[i] = p[i] * q[i]
            elif code == DIV:
                for i in range(n):
                    y[i] = p[i] / q[i]
            elif code == MAX:
                for i in range(n):
                    y[i] = max(p[i], q[i])
            else:
                for i in range(n):
                    y[i] = min(p[i], q[i])
        else:
            for i in range(n):
                u, w = arena[a + i * sa], arena[b + i * sb]
                if code == ADD:
                    y[i] = u + w
                elif code == SUB:
                    y[i] = u - w
                elif code == MUL:
                    y[i] = u * w
                elif code == DIV:
                    y[i] = u / w
                elif code == MAX:
                    y[i] = max(u, w)
                else:
                    y[i] = min(u, w)
        if relu:
            for i in range(n):
                y[i] = max(y[i], zero)


def _size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _code(node, ins, outs):
    """The instruction code for a node this module runs, or None."""
    if node.op == "UnaryOp":
        return UNARY.get(node.param.get("opType"))
    if node.op == "ReLU" and float(node.param.get("slope", 0.0)) != 0.0:
        return None
    if node.op in OP_TYPES:
        return OP_TYPES[node.op]
    if node.op == "BinaryOp":
        code = BINARY.get(node.param.get("opType"))
        if code is None or len(ins) != 2 or int(node.param.get("activationType", 0)) not in (0, 1):
            return None
        out = tuple(outs[0].shape)
        for v in ins:      # the output's shape (leading 1s aside) or one value: no other broadcast
            shape = tuple(v.shape)
            if _size(shape) != 1 and (len(shape) > len(out) or (1,) * (len(out) - len(shape)) + shape != out):
                return None
        return code
    if node.op == "Slice":
        try:
            axis, _ = split_bounds(node, ins, outs)
        except Exception:
            return None
        return SPLIT if _size(ins[0].shape[:axis]) == 1 else None    # pieces are contiguous ranges
    return None


def runs_here(node, ins, outs) -> bool:
    """Whether `node` can join a program: small float32 tensors, no int8 grid, an op `execute` has."""
    vals = list(ins) + list(outs)
    if not outs or any(v.shape is None or not all(isinstance(d, int) for d in v.shape) for v in vals):
        return False
    if any(v.dtype != "float32" or v.grid is not None or _size(v.shape) > LIMIT for v in vals):
        return False
    return _code(node, ins, outs) is not None


class Programs:
    """Builds the programs of one plan: regions of the shared arena by tensor name, and per program its
    instructions, external inputs and the views it returns (filled once the arena exists)."""

    def __init__(self):
        self.size = 0
        self.where: dict[str, int] = {}
        self.pending: list = []         # (output names, views list) to fill in `finish`
        self._open()

    def _open(self):
        self.rows, self.externals, self.outputs, self.nodes = [], [], [], []

    def _region(self, name: str, n: int) -> int:
        self.where[name] = self.size
        self.size += -(-n // ALIGN) * ALIGN
        return self.where[name]

    def externals_of(self, node) -> list[str]:
        return [i for i in node.inputs if i not in self.where and i not in self.externals]

    def fits(self, node) -> bool:
        return len(self.externals) + len(set(self.externals_of(node))) <= EXTERNAL

    def add(self, node, ins, outs) -> None:
        for name, v in zip(node.inputs, ins):
            if name not in self.where:
                self.externals.append(name)
                self.rows.append((LOAD, self._region(name, _size(v.shape)), len(self.externals) - 1, 0,
                                  _size(v.shape), 0, 0, 0))
        code, n = _code(node, ins, outs), _size(outs[0].shape)
        src = [self.where[i] for i in node.inputs]
        if node.op == "Slice":
            axis, bounds = split_bounds(node, ins, outs)
            inner = _size(ins[0].shape[axis + 1:])
            for name, lo in zip(node.outputs, bounds[:-1]):
                self.where[name] = src[0] + lo * inner
        elif node.op == "BinaryOp":
            steps = [0 if _size(v.shape) == 1 else 1 for v in ins]
            relu = int(node.param.get("activationType", 0)) == 1
            self.rows.append((code, self._region(node.outputs[0], n), src[0], src[1], n, steps[0], steps[1], relu))
        else:
            self.rows.append((code, self._region(node.outputs[0], n), src[0], 0, n, 0, 0, 0))
        self.outputs += [(name, tuple(v.shape)) for name, v in zip(node.outputs, outs)]
        self.nodes.append(node)

    def close(self):
        """The open program as (nodes, external input names, output names, Kernel); starts a new one."""
        prog = np.array(self.rows, np.int64).reshape(-1, 8)
        views: list = []
        self.pending.append((list(self.outputs), views))
        holder = self         # the arena is made in finish()
        count = len(self.externals)
        dummy = np.zeros(1, np.float32)

        pad = [dummy] * (EXTERNAL - count)

        def run(inputs):
            ext = [x.reshape(-1) for x in inputs] + pad     # float32 (runs_here); copies if not contiguous
            execute(prog, holder.arena, ext[0], ext[1], ext[2], ext[3])
            return views
        done = (list(self.nodes), list(self.externals), [o for o, _ in self.outputs], Kernel(run, False))
        self._open()
        return done

    def finish(self) -> None:
        self.arena = aligned_empty(max(self.size, 1))
        for outputs, views in self.pending:
            views[:] = [self.arena[self.where[name]:self.where[name] + _size(shape)].reshape(shape)
                        for name, shape in outputs]
