"""aten::index and aten::index_put_: torch's advanced indexing (x[i, j], x[:, idx], x[mask], x[mask] = v).

An index list holds one entry per leading dim of x: None (the whole dim), a tensor of indices, or a
boolean mask over one or more dims. Torch's rule, which these lowerings keep: the index tensors broadcast
to one shape B; when they sit on adjacent dims B takes their place in the result, otherwise B comes
first. A boolean mask known at conversion becomes its coordinates (np.nonzero); one computed at run time
has a data-dependent count, which the static shapes here can only hold in index_put_, where a mask
selects elements in place (Where).
"""
from __future__ import annotations

import numpy as np

from ...errors import MnnToolError
from ..shape_tracking import T, emit_onnx
from .context import aten, is_bool


def _tmp(ctx, node, tag):
    return ctx.tmp(f"{ctx.out(node)}_{tag}")


def _is_bool(ctx, node, k, idx) -> bool:
    if not isinstance(idx, T):
        return np.asarray(idx).dtype == np.bool_
    try:
        src = list(node.inputs())[1].node()
    except AttributeError:          # a torch.export call: its list is not a graph value
        return node.list_item_is_bool(1, k)
    return src.kind() == "prim::ListConstruct" and is_bool(list(src.inputs())[k])


def _positions(ctx, node, x, indices) -> list[tuple[int, object]]:
    """[(dim, index)] with masks known at conversion expanded to their coordinates, one per dim."""
    out, dim = [], 0
    for k, idx in enumerate(indices):
        if idx is None:
            dim += 1
            continue
        if _is_bool(ctx, node, k, idx):
            if isinstance(idx, T):
                raise MnnToolError(f"{ctx.path}: aten::index ({node.scopeName() or 'graph'}): a boolean mask "
                                   "computed at run time selects a data-dependent number of elements; not supported")
            coords = np.nonzero(np.asarray(idx))
            out.extend((dim + j, c.astype(np.int64)) for j, c in enumerate(coords))
            dim += len(coords)
            continue
        out.append((dim, idx))
        dim += 1
    return out


def _non_negative(ctx, node, idx, size: int, tag: str):
    """Indices with negatives counted from the end (MNN's gathers read them as they are)."""
    if not isinstance(idx, T):
        v = np.asarray(idx).astype(np.int64)
        return np.where(v < 0, v + size, v)
    neg = emit_onnx(ctx, "Less", [idx, np.int32(0)], [_tmp(ctx, node, f"{tag}_neg")])[0]
    shifted = emit_onnx(ctx, "Add", [idx, np.int32(size)], [_tmp(ctx, node, f"{tag}_up")])[0]
    return emit_onnx(ctx, "Where", [neg, shifted, idx], [_tmp(ctx, node, f"{tag}_pos")])[0]


def _coordinates(ctx, node, shape, pos) -> tuple[T, tuple]:
    """The indices of `pos` [(dim of `shape`, index)] broadcast together and stacked on a last axis:
    [*B, len(pos)], and B."""
    bshape = np.broadcast_shapes(*[tuple(ctx.shape_of(i)) for _, i in pos])
    cols = []
    for k, (d, i) in enumerate(pos):
        i = _non_negative(ctx, node, i, shape[d], f"i{k}")
        if not isinstance(i, T):
            cols.append(np.broadcast_to(np.asarray(i), bshape)[..., None])
            continue
        if tuple(ctx.shape_of(i)) != bshape:
            i = ctx.emit("BroadcastTo", [i, ctx.tensor(np.array(bshape, np.int32))], [_tmp(ctx, node, f"b{k}")], {})[0]
        cols.append(ctx.emit("Unsqueeze", [i], [_tmp(ctx, node, f"u{k}")], {"squeezeDims": [len(bshape)]})[0])
    if not any(isinstance(c, T) for c in cols):
        return ctx.tensor(np.concatenate(cols, -1).astype(np.int32)), bshape
    coords = ctx.emit("Concat", [ctx.tensor(c) for c in cols], [_tmp(ctx, node, "coords")],
                      {"axis": len(bshape)})[0] if len(cols) > 1 else cols[0]
    return coords, bshape


def _flat_coordinates(ctx, node, shape, pos) -> tuple[T, tuple]:
    """The indices of `pos` as one index into their dims flattened together, [*B, 1], and B. MNN's
    ScatterNd writes only the first last-dim run of each slice when an index has two or more
    coordinates (measured: 4 of each slice's 24 values on a [2, 5, 6, 4] tensor), so writes index one dim."""
    bshape = np.broadcast_shapes(*[tuple(ctx.shape_of(i)) for _, i in pos])
    sizes = [shape[d] for d, _ in pos]
    flat = None
    for k, (d, i) in enumerate(pos):
        i = _non_negative(ctx, node, i, shape[d], f"i{k}")
        stride = int(np.prod(sizes[k + 1:], dtype=np.int64))
        if stride != 1:
            i = np.asarray(i) * stride if not isinstance(i, T) else \
                emit_onnx(ctx, "Mul", [i, np.int32(stride)], [_tmp(ctx, node, f"s{k}")])[0]
        if flat is None:
            flat = i
        elif isinstance(flat, T) or isinstance(i, T):
            flat = emit_onnx(ctx, "Add", [flat, i], [_tmp(ctx, node, f"f{k}")])[0]
        else:
            flat = np.asarray(flat) + np.asarray(i)
    if not isinstance(flat, T):
        return ctx.tensor(np.broadcast_to(np.asarray(flat), bshape)[..., None].astype(np.int32)), bshape
    if tuple(ctx.shape_of(flat)) != bshape:
        flat = ctx.emit("BroadcastTo", [flat, ctx.tensor(np.array(bshape, np.int32))], [_tmp(ctx, node, "fb")], {})[0]
    return ctx.emit("Unsqueeze", [flat], [_tmp(ctx, node, "flat")], {"squeezeDims": [len(bshape)]})[0], bshape


def _front(ctx, node, x, dims: list[int], tag: str):
    """x with `dims` moved to the front in order (the gathers and scatters index leading dims); the perm."""
    rank = len(ctx.shape_of(x))
    perm = dims + [d for d in range(rank) if d not in dims]
    if perm == list(range(rank)):
        return x, perm
    if not isinstance(x, T):
        return np.transpose(np.asarray(x), perm), perm
    return ctx.emit("Permute", [x], [_tmp(ctx, node, tag)], {"dims": perm})[0], perm


@aten("aten::index")
def index(ctx, node, args):
    x, indices = args[0], list(args[1])
    if not isinstance(x, T) and not any(isinstance(i, T) for i in indices):
        return [np.asarray(x)[tuple(slice(None) if i is None else np.asarray(i) for i in indices)]]
    shape = ctx.shape_of(x)
    pos = _positions(ctx, node, x, indices)
    if len(pos) == 1:               # one index tensor: a gather along its dim keeps torch's layout
        d, i = pos[0]
        return emit_onnx(ctx, "Gather", [x, i], [ctx.out(node)], {"axis": d})
    dims = [d for d, _ in pos]
    xf, _ = _front(ctx, node, x, dims, "front")
    coords, bshape = _coordinates(ctx, node, shape, pos)
    rest = [d for d in range(len(shape)) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    lead = dims[0] if adjacent else 0      # result dims before B: x's dims ahead of adjacent indices
    if lead == 0:
        return ctx.emit("GatherND", [xf, coords], [ctx.out(node)], {"axis": 0})
    g = ctx.emit("GatherND", [xf, coords], [_tmp(ctx, node, "gathered")], {"axis": 0})[0]
    nb = len(bshape)
    perm = list(range(nb, nb + lead)) + list(range(nb)) + list(range(nb + lead, nb + len(rest)))
    return ctx.emit("Permute", [g], [ctx.out(node)], {"dims": perm})


@aten("aten::index_put")
def index_put(ctx, node, args):
    """x with values written at the indices (added where `accumulate`); torch's in-place form is
    traced as the same op, its result the updated tensor."""
    x, indices, values = args[0], list(args[1]), args[2]
    accumulate = bool(args[3]) if len(args) > 3 else False
    shape = ctx.shape_of(x)
    dtype = ctx.val(x).dtype if isinstance(x, T) else str(np.asarray(x).dtype)
    values = values if isinstance(values, T) else np.asarray(values, np.float32 if dtype.startswith("float")
                                                              else np.int32)
    present = [(k, i) for k, i in enumerate(indices) if i is not None]
    if len(present) == 1 and _is_bool(ctx, node, present[0][0], present[0][1]) and isinstance(present[0][1], T):
        return _masked_put(ctx, node, x, indices, values, accumulate, shape)
    pos = _positions(ctx, node, x, indices)
    dims = [d for d, _ in pos]
    xf, perm = _front(ctx, node, x, dims, "front")
    coords, bshape = _flat_coordinates(ctx, node, shape, pos)
    fshape = tuple(ctx.shape_of(xf))
    joined = (int(np.prod([shape[d] for d in dims], dtype=np.int64)),) + fshape[len(dims):]
    if len(dims) > 1:
        xf = ctx.reshape(xf, joined, _tmp(ctx, node, "joined"))[0] if isinstance(xf, T) else np.reshape(xf, joined)
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    lead = dims[0] if adjacent else 0
    # the values broadcast to what x[indices] would be, then laid out as the front-moved x reads them
    rest = [shape[d] for d in range(len(shape)) if d not in dims]
    target = tuple(rest[:lead]) + tuple(bshape) + tuple(rest[lead:])
    upd = ctx.emit("BroadcastTo", [ctx.tensor(values), ctx.tensor(np.array(target, np.int32))],
                   [_tmp(ctx, node, "values")], {})[0]
    if lead:
        nb = len(bshape)
        order = list(range(lead, lead + nb)) + list(range(lead)) + list(range(lead + nb, len(target)))
        upd = ctx.emit("Permute", [upd], [_tmp(ctx, node, "vfront")], {"dims": order})[0]
    identity = perm == list(range(len(shape)))
    out = ctx.out(node) if identity and len(dims) == 1 else _tmp(ctx, node, "scattered")
    y = ctx.emit("ScatterNd", [coords, upd, ctx.tensor(np.array(joined, np.int32)), ctx.tensor(xf)], [out],
                 {"opType": "ADD" if accumulate else -1, "T": "DT_FLOAT"})[0]
    if len(dims) > 1:
        y = ctx.reshape(y, fshape, ctx.out(node) if identity else _tmp(ctx, node, "unjoined"))[0]
    if identity:
        return [y]
    return ctx.emit("Permute", [y], [ctx.out(node)], {"dims": [perm.index(d) for d in range(len(shape))]})


def _masked_put(ctx, node, x, indices, values, accumulate, shape):
    """x[mask] = v with a run-time mask over dims d..d+k: Where(mask, v, x), the value broadcast over the
    mask's elements (a value per selected element has a data-dependent count: refused)."""
    d = next(k for k, i in enumerate(indices) if i is not None)
    mask = indices[d]
    mshape = tuple(ctx.shape_of(mask))
    vshape = tuple(ctx.shape_of(values))
    tail = tuple(shape[d + len(mshape):])
    if int(np.prod(vshape)) != 1 and vshape != tail[len(tail) - len(vshape):]:
        raise MnnToolError(f"{ctx.path}: aten::index_put_ ({node.scopeName() or 'graph'}): a value per element "
                           "selected by a run-time mask has a data-dependent count; only a value broadcast over "
                           "them is supported")
    full = (1,) * d + mshape + (1,) * len(tail)
    m = ctx.reshape(mask, full, _tmp(ctx, node, "mask"))[0] if full != mshape else mask
    v = values
    if accumulate:
        v = emit_onnx(ctx, "Add", [x, values], [_tmp(ctx, node, "sum")])[0]
    elif not isinstance(v, T):
        v = np.asarray(v).reshape(vshape)
    return emit_onnx(ctx, "Where", [m, v, x], [ctx.out(node)])
