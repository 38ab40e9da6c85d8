"""ONNX shape, slicing, joining and constant ops -> IR."""
from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from ...errors import MnnToolError
from ...ir.dtypes import to_mnn
from .context import ir_value, shape_int32, to_int32
from .fold import MAX_FOLD_ELEMENTS
from .registry import converts

ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
               10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16", 17: "float8", 18: "float8",
               19: "float8", 20: "float8", 21: "uint4", 22: "int4", 23: "float4", 25: "uint2", 26: "int2"}


def ir_dtype(onnx_type: int) -> str | None:
    """The type a tensor of this ONNX type has in the IR and in MNN: every float type is carried as
    float32 (MNN computes in float32; float16/bfloat16/float8 values are exact in it), every integer and
    boolean type as int32 (MNN's integer type). None for strings and complex numbers."""
    name = ONNX_DTYPES.get(int(onnx_type))
    if name is None:
        return None
    return "float32" if name.startswith(("float", "bfloat")) else "int32"


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _axis(ctx, node, a, default=0):
    axis = int(a.get("axis", default))
    if axis < 0:
        rank = ctx.rank(node.input[0])
        if rank is None:
            raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': negative axis needs a known input rank")
        axis += rank
    return axis


def _empty(ctx, name: str) -> bool:
    c = ctx.const(name)
    return c is not None and c.size == 0 and c.ndim > 0


@converts("Concat")
def concat(ctx, node, a):
    ins = [i for i in node.input if i]
    kept = [i for i in ins if not _empty(ctx, i)] or ins[:1]     # MNN's Concat fails on empty inputs
    if len(kept) == 1 and len(ins) > 1:
        ctx.emit("Identity", kept, [node.output[0]], {}, node.name)
        return
    ctx.emit("Concat", kept, [node.output[0]], {"axis": _axis(ctx, node, a)}, node.name)


@converts("Split")
def split(ctx, node, a):
    axis = _axis(ctx, node, a)
    sizes = a.get("split")
    run_time = None
    if sizes is None and len(node.input) > 1 and node.input[1]:
        v = ctx.const(node.input[1])
        if v is None:
            run_time = node.input[1]
        else:
            sizes = v.reshape(-1).tolist()
    if run_time is not None:      # MNN's Slice reads the sizes from its 2nd input (sourceType TORCH)
        ctx.emit("Slice", [node.input[0], run_time], list(node.output), {"axis": axis, "sourceType": "TORCH"},
                 node.name)
        return
    if sizes is None:
        shape = ctx.shape(node.input[0])
        dim = shape[axis] if shape else None
        if not isinstance(dim, int):
            raise MnnToolError(f"{ctx.path}: Split '{node.name}': needs split sizes or a known dimension")
        n = len(node.output)
        sizes = [-(-dim // n)] * (n - 1)
        sizes.append(dim - sum(sizes))
    sizes = [int(s) for s in sizes]
    if 0 in sizes and len(sizes) > 1:
        return _split_with_empty_parts(ctx, node, axis, sizes)
    points = np.cumsum(sizes)[:-1].tolist()
    ctx.emit("Slice", [node.input[0]], list(node.output), {"axis": axis, "slicePoints": points,
                                                           "sourceType": "CAFFE"}, node.name)


def _split_with_empty_parts(ctx, node, axis: int, sizes: list) -> None:
    """A Split with parts of size 0 (RotaryEmbedding's function body when the whole head rotates): MNN's
    Slice fails on an empty output (its other outputs came back as garbage, measured), so the empty parts
    become empty constants (a Concat drops them) and the rest is split without them."""
    shape = ctx.shape(node.input[0])
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise MnnToolError(f"{ctx.path}: Split '{node.name}': a part of size 0 needs the input's shape at convert "
                           "time (give --input-shape)")
    keep = [(o, s) for o, s in zip(node.output, sizes) if s > 0]
    for o, s in zip(node.output, sizes):
        if s == 0 and o:
            empty = list(shape)
            empty[axis % len(shape)] = 0
            ctx.g.constants[o] = np.zeros(empty, np.dtype(ctx.dtype(node.input[0]) or "float32"))
    if len(keep) == 1:
        ctx.emit("Identity", [node.input[0]], [keep[0][0]], {}, node.name)
    elif keep:
        points = np.cumsum([s for _, s in keep])[:-1].tolist()
        ctx.emit("Slice", [node.input[0]], [o for o, _ in keep], {"axis": axis, "slicePoints": points,
                                                                  "sourceType": "CAFFE"}, node.name)


@converts("Slice")
def slice_(ctx, node, a):
    """StridedSlice (ONNX form) with starts/ends/axes/steps as inputs: constants where they are, the
    run-time tensors otherwise; absent axes/steps default to 0..n-1 and ones."""
    if "starts" in a:   # opset < 10
        vals = [a["starts"], a["ends"], a.get("axes", list(range(len(a["starts"])))), [1] * len(a["starts"])]
        ins = [node.input[0]] + [ctx.int_const(f"{node.name}_{k}", to_int32(np.asarray(v, np.int64)))
                                 for k, v in zip(("starts", "ends", "axes", "steps"), vals)]
        ctx.emit("StridedSlice", ins, [node.output[0]], {"fromType": 1, "T": "DT_FLOAT"}, node.name)
        return
    names = [node.input[k] if len(node.input) > k and node.input[k] else None for k in range(1, 5)]
    n = None
    for nm in names[:2]:
        v = ctx.const(nm)
        shape = v.shape if v is not None else ctx.shape(nm)
        if shape is not None and len(shape) == 1 and isinstance(shape[0], int):
            n = shape[0]
    ins = [node.input[0]]
    for k, (nm, label) in enumerate(zip(names, ("starts", "ends", "axes", "steps"))):
        if nm is None:
            if n is None:
                raise MnnToolError(f"{ctx.path}: Slice '{node.name}': the number of sliced axes is unknown")
            ins.append(ctx.int_const(f"{node.name}_{label}", list(range(n)) if label == "axes" else [1] * n))
            continue
        v = ctx.const(nm)
        ins.append(ctx.int_const(f"{node.name}_{label}", to_int32(np.asarray(v, np.int64).reshape(-1)))
                   if v is not None else nm)
    ctx.emit("StridedSlice", ins, [node.output[0]], {"fromType": 1, "T": "DT_FLOAT"}, node.name)


@converts("Reshape")
def reshape(ctx, node, a):
    shape = ctx.exact(node.input[1])
    ins = [node.input[0], node.input[1]]
    if shape is not None:
        shape = shape.reshape(-1).astype(np.int64)
        src = ctx.shape(node.input[0])
        if (shape == 0).any() and not a.get("allowzero", 0):
            # known dims are written out; open ones keep the 0, which copies the dim in MNN's Reshape too
            shape = np.array([src[i] if d == 0 and src is not None and i < len(src) and isinstance(src[i], int)
                              else d for i, d in enumerate(shape)], np.int64)
        ins[1] = ctx.int_const(node.name + "_shape", shape_int32(ctx, node, shape, "target shape"))
    ctx.emit("Reshape", ins, [node.output[0]], {"dimType": "NCHW"}, node.name)


@converts("Flatten")
def flatten(ctx, node, a):
    shape = ctx.shape(node.input[0])
    axis = int(a.get("axis", 1))
    if shape is None:
        raise MnnToolError(f"{ctx.path}: Flatten '{node.name}': input rank unknown")
    axis %= max(len(shape), 1) if axis < 0 else len(shape) + 1
    head = shape[:axis]
    if all(isinstance(d, int) for d in head):
        dims = [int(np.prod(head, dtype=np.int64)), -1]
        ctx.emit("Reshape", [node.input[0], ctx.int_const(node.name + "_shape", dims)], [node.output[0]],
                 {"dimType": "NCHW"}, node.name)
    else:
        ctx.emit("Flatten", [node.input[0]], [node.output[0]], {"axis": axis, "endAxis": 0}, node.name)


@converts("Transpose")
def transpose(ctx, node, a):
    perm = a.get("perm")
    if perm is None:
        rank = ctx.rank(node.input[0])
        perm = list(range(rank))[::-1]
    ctx.emit("Permute", [node.input[0]], [node.output[0]], {"dims": [int(p) for p in perm]}, node.name)


@converts("ReverseSequence")
def reverse_sequence(ctx, node, a):
    """MNN reverses 1..steps elements per sequence: a known length outside that is refused here."""
    lengths, shape = ctx.const(node.input[1]), ctx.shape(node.input[0])
    steps = shape[int(a.get("time_axis", 0))] if shape is not None else None
    if lengths is not None and isinstance(steps, int) and ((lengths < 1) | (lengths > steps)).any():
        raise MnnToolError(f"{ctx.path}: ReverseSequence '{node.name}': sequence lengths {lengths.tolist()} "
                           f"outside 1..{steps}: MNN's ReverseSequence reverses at least one step")
    ctx.emit("ReverseSequence", [node.input[0], node.input[1]], [node.output[0]],
             {"batchDim": int(a.get("batch_axis", 1)), "seqDim": int(a.get("time_axis", 0))}, node.name)


def _axes_operand(ctx, node, a):
    """(constant axes list or None, run-time axes tensor or None)."""
    axes = a.get("axes")
    if axes is None and len(node.input) > 1 and node.input[1]:
        v = ctx.const(node.input[1])
        if v is None:
            return None, node.input[1]
        axes = v.reshape(-1).tolist()
    return ([int(x) for x in axes] if axes is not None else None), None


@converts("Squeeze")
def squeeze(ctx, node, a):
    axes, run_time = _axes_operand(ctx, node, a)
    ins = [node.input[0]] + ([run_time] if run_time else [])
    # with run-time axes the table stays empty: MNN reads an empty squeezeDims as "squeeze nothing"
    ctx.emit("Squeeze", ins, [node.output[0]], {} if run_time else {"squeezeDims": axes or []}, node.name)


@converts("Unsqueeze")
def unsqueeze(ctx, node, a):
    axes, run_time = _axes_operand(ctx, node, a)
    ins = [node.input[0]] + ([run_time] if run_time else [])
    ctx.emit("Unsqueeze", ins, [node.output[0]], {} if run_time else {"squeezeDims": axes or []}, node.name)


@converts("Shape")
def shape(ctx, node, a):
    start, end = a.get("start"), a.get("end")
    if start is None and end is None:
        ctx.emit("Shape", [node.input[0]], [node.output[0]], {}, node.name, fmt="NCHW")
        return
    full = ctx.tmp(node.output[0] + "_full")
    ctx.emit("Shape", [node.input[0]], [full], {}, node.name + "_full", fmt="NCHW")
    rank = ctx.rank(node.input[0])
    ins = [full] + [ctx.int_const(f"{node.name}_{k}", [v]) for k, v in
                    (("starts", start or 0), ("ends", end if end is not None else (rank or 2**31 - 1)), ("axes", 0))]
    ctx.emit("StridedSlice", ins, [node.output[0]], {"fromType": 1}, node.name)


@converts("Expand")
def expand(ctx, node, a):
    shp = ctx.exact(node.input[1])
    target = ctx.int_const(node.name + "_shape", shape_int32(ctx, node, shp, "target shape")) if shp is not None \
        else node.input[1]
    ctx.emit("BroadcastTo", [node.input[0], target], [node.output[0]], {}, node.name)


def emit_cast(ctx, node, x, out, onnx_type: int):
    dst = ir_dtype(onnx_type)
    if dst is None:
        raise MnnToolError(f"{ctx.path}: {node.op_type} '{node.name}': target type {onnx_type} "
                           f"({ONNX_DTYPES.get(int(onnx_type), 'string or complex')}) has no MNN type")
    if ONNX_DTYPES.get(int(onnx_type)) == "bool":     # any non-zero is true
        zero = ctx.float_const(node.name + "_zero", 0.0) if ctx.dtype(x).startswith(("float", "bfloat")) \
            else ctx.int_const(node.name + "_zero", 0)
        ctx.emit("BinaryOp", [x, zero], [out], {"opType": "NOTEQUAL", "T": "DT_FLOAT"}, node.name)
        return
    ctx.g.info(out).dtype = dst
    bits = NARROW_INTS.get(ONNX_DTYPES.get(int(onnx_type)))
    src_bits = NARROW_INTS.get(ctx.dtype(x), (64, True))
    if bits is None or bits[0] >= 32 or (src_bits[0] <= bits[0] and src_bits[1] == bits[1] and not ctx.dtype(x).startswith("float")):
        ctx.emit("Cast", [x], [out], {"dstT": to_mnn(dst)}, node.name)
        return
    # a narrower integer type, carried in int32: wrap around as C's conversion does
    n, signed = bits
    wide = ctx.tmp(out + "_i32")
    ctx.emit("Cast", [x], [wide], {"dstT": "DT_INT32"}, node.name + "_i32")
    span = 1 << n
    if signed:
        shifted, wrapped = ctx.tmp(out + "_sh"), ctx.tmp(out + "_wr")
        half = ctx.int_const(node.name + "_half", span // 2)
        ctx.emit("BinaryOp", [wide, half], [shifted], {"opType": "ADD", "T": "DT_INT32"}, shifted)
        ctx.emit("BinaryOp", [shifted, ctx.int_const(node.name + "_span", span)], [wrapped],
                 {"opType": "MOD", "T": "DT_INT32"}, wrapped)       # MNN's integer MOD is floor mod
        ctx.emit("BinaryOp", [wrapped, half], [out], {"opType": "SUB", "T": "DT_INT32"}, node.name)
    else:
        ctx.emit("BinaryOp", [wide, ctx.int_const(node.name + "_span", span)], [out],
                 {"opType": "MOD", "T": "DT_INT32"}, node.name)


NARROW_INTS = {"int8": (8, True), "uint8": (8, False), "int16": (16, True), "uint16": (16, False),
               "int4": (4, True), "uint4": (4, False), "int2": (2, True), "uint2": (2, False),
               "int32": (32, True), "uint32": (32, False), "int64": (64, True), "uint64": (64, False)}


@converts("Cast")
def cast(ctx, node, a):
    emit_cast(ctx, node, node.input[0], node.output[0], int(a["to"]))


@converts("CastLike")
def cast_like(ctx, node, a):
    from onnx import helper
    like = ctx.dtype(node.input[1])
    try:
        onnx_type = helper.np_dtype_to_tensor_dtype(np.dtype(like))
    except (TypeError, KeyError):
        onnx_type = 1
    emit_cast(ctx, node, node.input[0], node.output[0], onnx_type)


@converts("Pad")
def pad(ctx, node, a):
    """Padding with MNN's interleaved pads [b0, e0, b1, e1, ...] (ONNX lists begins then ends): reordered
    at convert time when constant, by Reshape/Transpose at run time (as MNN's converter does) when not;
    the constant value as a 3rd input. `wrap` and run-time axes have no MNN form."""
    mode = _s(a.get("mode", b"constant"))
    if mode not in ("constant", "reflect", "edge"):
        raise MnnToolError(f"{ctx.path}: Pad '{node.name}': mode {mode} is not supported")
    x, out = node.input[0], node.output[0]
    rank = ctx.rank(x)
    pads_name = node.input[1] if len(node.input) > 1 and node.input[1] else None
    pads = a.get("pads")
    if pads is None and pads_name is not None and ctx.const(pads_name) is not None:
        pads = ctx.const(pads_name).reshape(-1).tolist()
    axes_name = node.input[3] if len(node.input) > 3 and node.input[3] else None
    if axes_name is not None:
        axes = ctx.const(axes_name)
        if axes is None or pads is None or rank is None:
            raise MnnToolError(f"{ctx.path}: Pad '{node.name}': the axes input needs constant pads and axes")
        full = [0] * (2 * rank)
        axes = [int(v) % rank for v in axes.reshape(-1)]
        for i, ax in enumerate(axes):
            full[ax], full[ax + rank] = int(pads[i]), int(pads[i + len(axes)])
        pads = full
    ins = [x]
    if pads is not None:
        r = len(pads) // 2
        ins.append(ctx.int_const(node.name + "_pads", [int(p) for i in range(r) for p in (pads[i], pads[i + r])]))
    else:
        pr, pt = ctx.tmp(out + "_pads2"), ctx.tmp(out + "_padsT")
        flat = ctx.tmp(out + "_pads")
        ctx.emit("Reshape", [pads_name, ctx.int_const(node.name + "_2m1", [2, -1])], [pr], {"dimType": "NCHW"}, pr)
        ctx.emit("Transpose", [pr, ctx.int_const(node.name + "_perm", [1, 0])], [pt], {}, pt)
        ctx.emit("Reshape", [pt, ctx.int_const(node.name + "_m1", [-1])], [flat], {"dimType": "NCHW"}, flat)
        ins.append(flat)
    value_name = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if mode == "constant":
        if value_name is not None:
            v = ctx.const(value_name)
            if v is None or float(np.asarray(v).reshape(-1)[0]) != 0.0:
                ins.append(value_name if v is None else ctx.g.add_const(node.name + "_value", np.asarray(v).reshape(())))
        elif float(a.get("value", 0.0)) != 0.0:
            ins.append(ctx.float_const(node.name + "_value", np.float32(a["value"])))
    ctx.emit("Padding", ins, [out], {"mode": {"constant": "CONSTANT", "reflect": "REFLECT", "edge": "EDGE"}[mode]},
             node.name)


@converts("Dropout")
def dropout(ctx, node, a):
    """Inference Dropout passes x through (MNN has no such op); its mask output is all true, a Fill of
    x's shape. training_mode must not be true: that draws random numbers."""
    if len(node.input) > 2 and node.input[2]:
        mode = ctx.const(node.input[2])
        if mode is None or bool(np.asarray(mode).reshape(-1)[0]):
            raise MnnToolError(f"{ctx.path}: Dropout '{node.name}': training_mode (random masks) is not supported")
    ctx.emit("Identity", [node.input[0]], [node.output[0]], {}, node.name)
    if len(node.output) > 1 and node.output[1]:
        shape = ctx.tmp(node.output[1] + "_shape")
        ctx.emit("Shape", [node.input[0]], [shape], {}, shape, fmt="NCHW")
        ctx.emit("Fill", [shape, ctx.g.add_const(node.name + "_true", np.array(1, np.int32))], [node.output[1]], {},
                 node.name + "_mask", fmt="NCHW")


@converts("Identity")
def identity(ctx, node, a):
    value = ctx.const(node.input[0])
    if value is not None and node.output[0] not in ctx.g.outputs:   # exporters alias shared weights
        ctx.g.constants[node.output[0]] = value
        return
    ctx.emit("Identity", [node.input[0]], [node.output[0]], {}, node.name)


def _attr_value(a):
    if "value" in a:
        return numpy_helper.to_array(a["value"])
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                       ("value_ints", np.int64)):
        if key in a:
            return np.asarray(a[key], dtype=dtype)
    raise KeyError("Constant without a supported value attribute")


@converts("Constant")
def constant(ctx, node, a):
    value = _attr_value(a)
    value = ir_value(value)
    ctx.g.constants[node.output[0]] = value
    ctx.g.info(node.output[0]).shape = tuple(value.shape)
    ctx.g.info(node.output[0]).dtype = str(value.dtype)


@converts("ConstantOfShape")
def constant_of_shape(ctx, node, a):
    value = numpy_helper.to_array(a["value"]).reshape(-1) if "value" in a else np.zeros(1, np.float32)
    value = ir_value(value)
    shp = ctx.exact(node.input[0])
    if shp is not None:
        dims = shape_int32(ctx, node, shp, "shape")
        if np.prod(dims.astype(np.float64)) <= MAX_FOLD_ELEMENTS:
            ctx.g.constants[node.output[0]] = np.full(dims.tolist(), value[0], value.dtype)
            return
    ctx.emit("Fill", [node.input[0], ctx.g.add_const(node.name + "_value", value.reshape(()))], [node.output[0]],
             {}, node.name, fmt="NCHW")
