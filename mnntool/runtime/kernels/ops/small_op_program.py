"""Runs of small ops executed as one program in one Numba call.

An unrolled LSTM does thirteen ops on 64-256 floats per time step (its slice of the inputs, the
recurrent MatMul, the gates' add and split, three sigmoids and a tanh, the cell update, its tanh, the
output): each cost about 1 us of Python and dispatch around 0.05-0.5 us of arithmetic. Consecutive
ops of that kind (float32, at most LIMIT elements, no int8 grid: Unary/Binary ops, Sigmoid, TanH,
ReLU, contiguous Slices and StridedSlices, one-row MatMuls with a constant of at most MATRIX_LIMIT)
become one step: their tensors live in one float32 arena (slices are ranges of their input's region,
no copy; constants are written into theirs once), inputs from outside are copied in by LOAD
instructions, and `execute` interprets the instructions. An LSTM layer of 16 steps is one program:
the LSTM fixture went 0.45 -> 0.09 ms at 1 thread. The arena is never reused, so every tensor stays
readable by later steps and by `keep_all`.
"""
from __future__ import annotations

import math

import numpy as np
from ..compile.jit import Bound, njit

from .. import Kernel, aligned_empty
from ..micro.float_gemv import dot16
from ..micro.parallel_rows import row_span
from ....ir.ops.tensor import split_points
from ..micro.exp_erf import EXP_FLOOR, exp_poly, exp_split


def split_bounds(node, ins, outs):
    if len(ins) > 1 and ins[1].value is None:
        raise ValueError("run-time split sizes")
    return split_points(node, ins[0].shape, ins[1].value if len(ins) > 1 else None)

LIMIT = 16384       # elements: larger tensors keep their own (vectorized, parallel) kernels
EXTERNAL = 4        # inputs from outside one program: one argument each
ALIGN = 16          # floats: each tensor's region starts on a cache line

LOAD, SIGMOID, TANH, RELU, NEG, EXP, ABS, ADD, SUB, MUL, DIV, MAX, MIN, MATVEC = range(14)
SPLIT = -1          # a Slice or StridedSlice: no instruction, its pieces are ranges of the input's region
MATRIX_LIMIT = 65536    # weights of a one-row MatMul (floats) copied into the arena; larger ones stream (gemv)
UNARY = {"SIGMOID": SIGMOID, "TANH": TANH, "NEG": NEG, "EXP": EXP, "ABS": ABS}
OP_TYPES = {"Sigmoid": SIGMOID, "TanH": TANH, "ReLU": RELU}
BINARY = {"ADD": ADD, "SUB": SUB, "MUL": MUL, "REALDIV": DIV, "DIV": DIV, "MAXIMUM": MAX, "MINIMUM": MIN}


@njit(cache=True, fastmath=True, error_model="numpy")
def execute(prog, arena, e0, e1, e2, e3):
    """Rows (code, dst, a, b, n, a_step, b_step, relu): LOAD copies external a's n floats from its
    element b to dst, in rows of a_step floats b_step apart where a_step > 0 (a strided view: `Externals`); a unary op maps arena[a:a+n]; a binary op combines arena[a + i*a_step] and
    arena[b + i*b_step] (a step of 0 broadcasts one value), then max(., 0) when relu; MATVEC is the
    row arena[a:a+k] (k in a_step) times the matrix at arena[b], stored transposed as (n, k).

    Written for LLVM's vectorizer: one loop per op (chosen outside it), indices unsigned (a signed
    index gets Numba's negative-index wrap, which stops vectorizing; slices instead cost ~100 ns an
    instruction in reference counting), and the numpy error model (Python's raises on a zero divisor,
    a branch in every division): sigmoid 2.7 -> 0.3 ns an element."""
    zero, one = np.float32(0), np.float32(1)
    bits = arena.view(np.int32)
    for r in range(prog.shape[0]):
        code = prog[r, 0]
        d, a, b, n = np.uint64(prog[r, 1]), np.uint64(prog[r, 2]), np.uint64(prog[r, 3]), np.uint64(prog[r, 4])
        if code == LOAD:
            src = e0 if a == 0 else e1 if a == 1 else e2 if a == 2 else e3
            run, step = np.uint64(prog[r, 5]), np.uint64(prog[r, 6])
            if run == 0:
                for i in range(n):
                    arena[d + i] = src[b + i]
            else:
                for q in range(n // run):
                    s0, d0 = b + q * step, d + q * run
                    for j in range(run):
                        arena[d0 + j] = src[s0 + j]
        elif code == MATVEC:     # the matrix stored (n, k): gemv's 16 dot products at a time
            k = prog[r, 5]
            for o in range(0, prog[r, 4], 16):
                dot16(arena, prog[r, 3] + o * k, k, arena, prog[r, 2], k, arena, prog[r, 1] + o, min(16, prog[r, 4] - o))
        elif code == SIGMOID or code == TANH:
            # e = exp(-|x|) (tanh: exp(-2|x|)) in (0, 1] as norm's exp: 2^k written as float bits,
            # then times e^f; libm's expf and tanhf would be calls in the loop
            scale = one if code == SIGMOID else np.float32(2)
            for i in range(n):
                k2, _ = exp_split(max(-scale * abs(arena[a + i]), EXP_FLOOR))
                bits[d + i] = (np.int32(k2) + 127) << 23
            for i in range(n):
                v = arena[a + i]
                _, f = exp_split(max(-scale * abs(v), EXP_FLOOR))
                e = arena[d + i] * exp_poly(f)
                if code == SIGMOID:
                    arena[d + i] = (one if v >= 0 else e) / (one + e)
                else:
                    t = (one - e) / (one + e)
                    arena[d + i] = t if v >= 0 else -t
        elif code == RELU:      # a loop each (one loop branching on the code did not vectorize: 0.4 ns an
            for i in range(n):  # element, 0.1 now)
                arena[d + i] = max(arena[a + i], zero)
        elif code == NEG:
            for i in range(n):
                arena[d + i] = -arena[a + i]
        elif code == EXP:
            for i in range(n):
                arena[d + i] = np.exp(arena[a + i])
        elif code == ABS:
            for i in range(n):
                arena[d + i] = abs(arena[a + i])
        else:
            sa, sb = np.uint64(prog[r, 5]), np.uint64(prog[r, 6])
            if code == ADD:
                for i in range(n):
                    arena[d + i] = arena[a + i * sa] + arena[b + i * sb]
            elif code == SUB:
                for i in range(n):
                    arena[d + i] = arena[a + i * sa] - arena[b + i * sb]
            elif code == MUL:
                for i in range(n):
                    arena[d + i] = arena[a + i * sa] * arena[b + i * sb]
            elif code == DIV:
                for i in range(n):
                    arena[d + i] = arena[a + i * sa] / arena[b + i * sb]
            elif code == MAX:
                for i in range(n):
                    arena[d + i] = max(arena[a + i * sa], arena[b + i * sb])
            else:
                for i in range(n):
                    arena[d + i] = min(arena[a + i * sa], arena[b + i * sb])
            if prog[r, 7]:
                for i in range(n):
                    arena[d + i] = max(arena[d + i], zero)


def _size(shape) -> int:
    return math.prod(int(d) for d in shape)


def _known(v) -> bool:
    return v.shape is not None and all(isinstance(d, int) for d in v.shape)


def _range_of(node, ins, outs):
    """A StridedSlice's output as (first element, count) of its input when it is one contiguous range
    (a time step of an unrolled RNN's inputs), else None."""
    from ....ir.ops.tensor import strided_index
    if any(v.value is None for v in ins[1:]):
        return None
    try:
        picked = np.arange(_size(ins[0].shape)).reshape(ins[0].shape)[
            strided_index(node, len(ins[0].shape), [v.value for v in ins[1:]])].reshape(-1)
    except Exception:
        return None
    if picked.size != _size(outs[0].shape) or picked.size == 0 or \
            not np.array_equal(picked, picked[0] + np.arange(picked.size)):
        return None
    return int(picked[0]), int(picked.size)


def _code(node, ins, outs, constants):
    """The instruction code for a node a program runs, or None."""
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
    if node.op == "StridedSlice":
        return SPLIT if _range_of(node, ins, outs) is not None else None
    if node.op == "MatMul":
        w = constants.get(node.inputs[1]) if len(node.inputs) == 2 else None
        if w is None or w.ndim != 2 or w.dtype != np.float32 or w.size > MATRIX_LIMIT or \
                node.param.get("transposeA") or node.param.get("adjX") or _size(ins[0].shape[:-1]) != 1:
            return None
        return MATVEC
    return None


def _data(node) -> list[str]:
    """The inputs an instruction reads as float32 data (the rest are shapes, indices or weights)."""
    return node.inputs[:1] if node.op in ("Slice", "StridedSlice", "MatMul") else node.inputs


def accepts(node, ins, outs, constants: dict) -> bool:
    """Whether a program can run the node: small float32 data, no int8 grid, an op `execute` has."""
    if node.op not in OP_TYPES and node.op not in ("UnaryOp", "BinaryOp", "Slice", "StridedSlice", "MatMul"):
        return False        # (what _code knows; asked first: the planner asks this of every op)
    data = [v for name, v in zip(node.inputs, ins) if name in _data(node)] + list(outs)
    if not outs or not all(_known(v) for v in data):
        return False
    if any(v.dtype != "float32" or v.grid is not None or _size(v.shape) > LIMIT for v in data):
        return False
    return _code(node, ins, outs, constants) is not None


class Externals:
    """A program's external inputs as execute takes them: a contiguous one flat (a view), a strided view of
    rows (EfficientViT's attention splits q, k, v off the last axis and ReLUs q and k: two (1, 16, 49, 16)
    views of rows 48 floats apart) as the flat span of memory its rows lie in, with its LOAD row reading
    rows of that stride (a copy by NumPy first cost 9 us an input, the program 22 us where it now takes 3);
    any other layout copied. The planner hands the same arrays every run, so the flat views and the
    program they need are kept while it does (one tuple, read once: runs on other threads may call too)."""

    def __init__(self, prog: np.ndarray, loads: list):
        self.prog, self.loads = prog, loads
        self.pad = [np.zeros(1, np.float32)] * (EXTERNAL - len(loads))
        self.kept = ((), prog, None)

    def __call__(self, inputs):
        seen, prog, ext = self.kept
        if ext is not None and len(seen) == len(inputs) and all(a is b for a, b in zip(seen, inputs)):
            return prog, ext
        prog, ext, keep = self.prog, [], True
        for k, x in enumerate(inputs):      # float32 (accepts)
            if x.flags.c_contiguous:
                ext.append(x.reshape(-1))
                continue
            run = x.shape[-1] if x.ndim else 1
            got = row_span(x, x.size // max(run, 1), run)
            if got is None:
                ext.append(np.ascontiguousarray(x).reshape(-1))     # a copy: not kept
                keep = False
                continue
            ext.append(got[0])
            if prog is self.prog:
                prog = self.prog.copy()
            prog[self.loads[k], 5], prog[self.loads[k], 6] = run, got[1]
        ext += self.pad
        if keep:
            self.kept = (tuple(inputs), prog, ext)
        return prog, ext


class Programs:
    """Builds the programs of one plan: regions of the shared arena by tensor name (constants written
    into theirs once, at `finish`), and per program its instructions, external inputs and the views it
    returns (filled once the arena exists)."""

    def __init__(self, constants: dict):
        self.constants = constants
        self.size = 0
        self.where: dict[str, int] = {}
        self.fill: list = []            # (offset, values) written into the arena at finish
        self.pending: list = []         # (output names and shapes, views list) to fill in `finish`
        self._open()

    def _open(self):
        self.rows, self.externals, self.outputs, self.nodes = [], [], [], []

    def accepts(self, node, ins, outs) -> bool:
        return accepts(node, ins, outs, self.constants)

    def _region(self, name: str, n: int) -> int:
        self.where[name] = self.size
        self.size += -(-n // ALIGN) * ALIGN
        return self.where[name]

    def _outside(self, node) -> list[str]:
        return [i for i in dict.fromkeys(_data(node)) if i not in self.where and i not in self.constants]

    def fits(self, node) -> bool:
        return len(self.externals) + len(self._outside(node)) <= EXTERNAL

    def _place(self, name: str, v) -> None:
        """Make `name` readable in the arena: a constant's values once, else a LOAD of the input."""
        if name in self.where:
            return
        if name in self.constants:
            self.fill.append((self._region(name, _size(v.shape)), np.asarray(self.constants[name], np.float32)))
            return
        self.externals.append(name)
        self.rows.append((LOAD, self._region(name, _size(v.shape)), len(self.externals) - 1, 0, _size(v.shape), 0, 0, 0))

    def add(self, node, ins, outs) -> None:
        for name, v in zip(node.inputs, ins):
            if name in _data(node):
                self._place(name, v)
        code, n = _code(node, ins, outs, self.constants), _size(outs[0].shape)
        src = [self.where.get(i, -1) for i in node.inputs]
        if node.op == "Slice":
            axis, bounds = split_bounds(node, ins, outs)
            inner = _size(ins[0].shape[axis + 1:])
            for name, lo in zip(node.outputs, bounds[:-1]):
                self.where[name] = src[0] + lo * inner
        elif node.op == "StridedSlice":
            self.where[node.outputs[0]] = src[0] + _range_of(node, ins, outs)[0]
        elif node.op == "MatMul":
            w = np.asarray(self.constants[node.inputs[1]], np.float32)
            wt = w if node.param.get("transposeB") or node.param.get("adjY") else w.T     # (n, k) for MATVEC
            key = node.inputs[1] + "__rows"
            if key not in self.where:
                self.fill.append((self._region(key, wt.size), np.ascontiguousarray(wt)))
            cols, k = wt.shape
            self.rows.append((MATVEC, self._region(node.outputs[0], n), src[0], self.where[key], cols, k, 0, 0))
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
        loads = [i for i, row in enumerate(self.rows) if row[0] == LOAD]     # external k's LOAD: loads[k]
        externals = Externals(prog, loads)
        interpret = Bound(execute)

        def run(inputs):
            p, ext = externals(inputs)
            interpret(p, holder.arena, ext[0], ext[1], ext[2], ext[3])
            return views
        done = (list(self.nodes), list(self.externals), [o for o, _ in self.outputs], Kernel(run, False))
        self._open()
        return done

    def finish(self) -> None:
        self.arena = aligned_empty(max(self.size, 1))
        for at, values in self.fill:
            self.arena[at:at + values.size] = values.reshape(-1)
        for outputs, views in self.pending:
            views[:] = [self.arena[self.where[name]:self.where[name] + _size(shape)].reshape(shape)
                        for name, shape in outputs]
