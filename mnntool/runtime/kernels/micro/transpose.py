"""Batched 2-D transpose in square blocks: (B, R, C) -> (B, C, R), the copy a Permute between token
layout (N, C) and channel planes (C, N) makes (PVT, PoolFormer, Swin-style blocks around their
convolutions). NumPy's copy of a transposed view walks the output in order and reads the input a
row stride apart, a new cache line (and at power-of-two strides the same cache set) every element:
(3136, 256) took 1.3 ms at best and 11 ms in the median here, (1024, 1024) 7.8 ms. In blocks of
BLOCK x BLOCK both sides touch BLOCK whole lines at a time, transposed in registers."""
from __future__ import annotations

import numpy as np

from ..compile.jit import intrinsic, njit, prange, types
from .llvm_ir import columns_to_rows, data_of, declare, first_lanes, vector_ops

BLOCK = 16      # input rows and columns of a block: one 64-byte line of each of 16 rows, read and written
# rows and columns a transpose needs for the blocks (1 thread, us: (3136, 32) 19 against NumPy's 60,
# (196, 128) 5/16, (3136, 256) 238/1664, (1024, 1024) 755/7908; shorter sides are mostly masked lanes)
MIN_SIDE = 8


@intrinsic
def _block8x16(typingctx, x, xo, ldx, rows, cols, out, oo, ldo):
    """out[oo + c * ldo + r] = x[xo + r * ldx + c] for r < rows (<= 8), c < cols (<= 16): eight masked
    row loads, the 16 x 8 transpose in registers (llvm_ir.columns_to_rows), `cols` masked 8-float stores."""
    from llvmlite import ir
    sig = types.void(x, types.intp, types.intp, types.intp, types.intp, out, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        xa, xo_, ldx_, rows_, cols_, oa, oo_, ldo_ = args
        i1, i32, i64, f32 = ir.IntType(1), ir.IntType(32), ir.IntType(64), ir.FloatType()
        f16, f8 = ir.VectorType(f32, 16), ir.VectorType(f32, 8)
        _, mload, _ = vector_ops(builder)
        store8 = declare(builder, "llvm.masked.store.v8f32.p0", ir.VoidType(), f8, f8.as_pointer(), i32,
                         ir.VectorType(i1, 8))
        xp = data_of(context, builder, sig.args[0], xa, xo_)
        op = data_of(context, builder, sig.args[5], oa, oo_)
        cmask = first_lanes(builder, cols_)
        none = ir.Constant(cmask.type, [0] * 16)
        zero = ir.Constant(f16, [0.0] * 16)
        vecs = []
        for r in range(8):
            mask = builder.select(builder.icmp_signed("<", ir.Constant(i64, r), rows_), cmask, none)
            at = builder.bitcast(builder.gep(xp, [builder.mul(ir.Constant(i64, r), ldx_)]), f16.as_pointer())
            vecs.append(builder.call(mload, [at, ir.Constant(i32, 4), mask, zero]))
        # the first `rows` of 8 lanes
        lanes8 = builder.shuffle_vector(first_lanes(builder, rows_), first_lanes(builder, rows_),
                                        ir.Constant(ir.VectorType(i32, 8), list(range(8))))
        for c, row in enumerate(columns_to_rows(builder, vecs)):
            with builder.if_then(builder.icmp_signed("<", ir.Constant(i64, c), cols_)):
                at = builder.bitcast(builder.gep(op, [builder.mul(ir.Constant(i64, c), ldo_)]), f8.as_pointer())
                builder.call(store8, [row, at, ir.Constant(i32, 4), lanes8])
        return context.get_dummy_value()
    return sig, codegen


# input columns a parallel item covers: items of BLOCK rows by this many columns, not whole rows, so a transpose
# of few row blocks still spreads over the threads (EfficientViT's (8, 48, 196) -> (8, 196, 48): 24 row blocks,
# 2 on some threads at 16 where 96 items of 64 columns are 6)
COL_GROUP = 4 * BLOCK


@njit(parallel=True, cache=True)
def transpose_blocks(x, out):
    """out[b, c, r] = x[b, r, c]: x (B, R, C) and out (B, C, R) C-contiguous. Items of BLOCK input rows by
    COL_GROUP columns are the parallel loop (a thread's run of them goes along a row block's columns, then the
    next block); each item's columns BLOCK at a time as two 8 x 16 register transposes, so every output row
    gets a whole line."""
    nb, R, C = x.shape
    nrb = (R + BLOCK - 1) // BLOCK
    ncg = (C + COL_GROUP - 1) // COL_GROUP
    xf, of = x.reshape(-1), out.reshape(-1)
    for j in prange(nb * nrb * ncg):
        rb = j // ncg
        b, r0, cg = rb // nrb, (rb % nrb) * BLOCK, (j % ncg) * COL_GROUP
        xb, ob = b * R * C, b * C * R
        for c0 in range(cg, min(C, cg + COL_GROUP), BLOCK):
            cols = min(BLOCK, C - c0)
            for h in range(r0, min(r0 + BLOCK, R), 8):
                _block8x16(xf, xb + h * C + c0, C, min(8, R - h), cols, of, ob + c0 * R + h, R)


def as_batched_transpose(shape: tuple, perm: tuple) -> tuple | None:
    """(B, R, C) when permuting `shape` by `perm` is a batched 2-D transpose of (B, R, C) to (B, C, R)
    (size-1 axes dropped, axes that stay neighbours merged), else None."""
    keep = [a for a in range(len(shape)) if shape[a] != 1]
    order = [a for a in perm if shape[a] != 1]
    # groups of input axes that stay neighbours, in output order
    groups = []
    for a in order:
        if groups and groups[-1][-1] + 1 == a:
            groups[-1].append(a)
        else:
            groups.append([a])
    if len(groups) == 1 and groups[0] == keep:
        return None         # no axis moves: not a transpose
    size = lambda g: int(np.prod([shape[a] for a in g]))    # noqa: E731
    in_order = sorted(groups, key=lambda g: g[0])
    if len(groups) == 2 and groups == in_order[::-1]:
        return 1, size(in_order[0]), size(in_order[1])
    if len(groups) == 3 and groups[0] == in_order[0] and groups[1] == in_order[2] and groups[2] == in_order[1]:
        return size(in_order[0]), size(in_order[1]), size(in_order[2])
    return None
