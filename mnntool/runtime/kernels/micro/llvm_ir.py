"""What the LLVM-IR micro-kernels (`int8_gemm`, `float_gemm`) share: the host check and IR building helpers."""
from __future__ import annotations

import os

from ..compile.host import host_features


def host_has(feature: str) -> bool:
    """`feature` (an LLVM name such as "avx512f") on the host, and Numba compiling for the host (not a
    portable NUMBA_CPU_NAME target)."""
    return feature in host_features() and os.environ.get("NUMBA_CPU_NAME", "host") == "host"


def data_of(context, builder, ty, value, offset=None):
    """The data pointer of a Numba array value inside generated IR, moved by `offset` elements."""
    from numba.core import cgutils
    data = cgutils.create_struct_proxy(ty)(context, builder, value=value).data
    return data if offset is None else builder.gep(data, [offset])


def declare(builder, name: str, ret, *args):
    """The intrinsic `name` (ret(*args)) in the builder's module."""
    from llvmlite import ir
    from numba.core import cgutils
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, list(args)), name)


def prefetch(builder, pointer, locality: int = 3):
    """A prefetch (read) of the cache line at `pointer` (any pointer type): into L1 at locality 3,
    L2 at 2."""
    from llvmlite import ir
    i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
    fn = declare(builder, "llvm.prefetch.p0", ir.VoidType(), i8p, i32, i32, i32)
    builder.call(fn, [builder.bitcast(pointer, i8p), ir.Constant(i32, 0), ir.Constant(i32, locality),
                      ir.Constant(i32, 1)])


def vector_ops(builder):
    """(fma, masked load, masked store) on <16 x float>: the three intrinsics every micro-kernel calls."""
    from llvmlite import ir
    f32, i32 = ir.FloatType(), ir.IntType(32)
    f16, m16 = ir.VectorType(f32, 16), ir.VectorType(ir.IntType(1), 16)
    return (declare(builder, "llvm.fma.v16f32", f16, f16, f16, f16),
            declare(builder, "llvm.masked.load.v16f32.p0", f16, f16.as_pointer(), i32, m16, f16),
            declare(builder, "llvm.masked.store.v16f32.p0", ir.VoidType(), f16, f16.as_pointer(), i32, m16))


def lanes(builder, lo, hi):
    """The 16-lane mask of lanes lo <= lane < hi (i64 values, clamped to 0..16), built in a scalar
    register: a k-register move, where a vector compare of 16 i64 lanes takes four instructions."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    zero, sixteen = ir.Constant(i64, 0), ir.Constant(i64, 16)
    clamp = lambda v: builder.select(builder.icmp_signed("<", v, zero), zero,  # noqa: E731
                                     builder.select(builder.icmp_signed(">", v, sixteen), sixteen, v))
    lo, hi = clamp(lo), clamp(hi)
    hi = builder.select(builder.icmp_signed("<", hi, lo), lo, hi)
    ones = lambda n: builder.sub(builder.shl(ir.Constant(i64, 1), n), ir.Constant(i64, 1))  # noqa: E731
    return lane_bits(builder, builder.xor(ones(hi), ones(lo)))


def first_lanes(builder, n):
    """The mask of lanes < n (clamped to 0..16)."""
    from llvmlite import ir
    return lanes(builder, ir.Constant(ir.IntType(64), 0), n)


def lane_bits(builder, word):
    """A 16-lane mask from the low 16 bits of an integer value."""
    from llvmlite import ir
    return builder.bitcast(builder.trunc(word, ir.IntType(16)), ir.VectorType(ir.IntType(1), 16))


def pointers(builder, base, offsets):
    """The 16 float pointers base + offsets[lane] (offsets: <16 x i64> in elements), for gathers and
    scatters (llvmlite's gep takes no vector index)."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    l16 = ir.VectorType(i64, 16)
    addr = builder.add(splat(builder, builder.ptrtoint(base, i64), l16), builder.shl(offsets, splat(builder, ir.Constant(i64, 2), l16)))
    return builder.inttoptr(addr, ir.VectorType(ir.FloatType().as_pointer(), 16))


def splat(builder, value, vt):
    """`value` in every lane of the vector type `vt`."""
    from llvmlite import ir
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vt.count), [0] * vt.count)
    lane = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(lane, ir.Constant(vt, ir.Undefined), zeros)


def k_loop(builder, nk, init, body, step: int = 1):
    """`for k in range(0, nk, step): accs = body(k, accs)` from `init`, as a loop of IR with phi
    accumulators (the micro-kernels' register tiles); the final accumulators, `init` when nk <= 0."""
    from llvmlite import ir
    i64 = ir.IntType(64)
    entry = builder.block
    loop, done = builder.append_basic_block("k"), builder.append_basic_block("k_done")
    builder.cbranch(builder.icmp_signed(">", nk, ir.Constant(i64, 0)), loop, done)
    builder.position_at_end(loop)
    kk = builder.phi(i64)
    kk.add_incoming(ir.Constant(i64, 0), entry)
    accs = []
    for value in init:
        phi = builder.phi(value.type)
        phi.add_incoming(value, entry)
        accs.append(phi)
    new = body(kk, accs)
    last = builder.block        # the body may have added blocks
    nxt = builder.add(kk, ir.Constant(i64, step))
    kk.add_incoming(nxt, last)
    for acc, value in zip(accs, new):
        acc.add_incoming(value, last)
    builder.cbranch(builder.icmp_signed("<", nxt, nk), loop, done)
    builder.position_at_end(done)
    out = []
    for first, value in zip(init, new):
        phi = builder.phi(value.type)
        phi.add_incoming(first, entry)
        phi.add_incoming(value, last)
        out.append(phi)
    return out


def columns_to_rows(builder, vecs):
    """The 16 x 8 transpose: from up to 8 <16 x float> (one per column j, lane i = row i) the 16
    <8 x float> rows (lane j = column j; columns past len(vecs) zero). Three rounds of pairwise
    interleaving shuffles, 48 in all, where a scatter of the same 16 x 8 (one per column) cost about
    40 cycles each here. Each lane's row is tracked alongside, to hand the rows back in order."""
    from llvmlite import ir
    i32, f32 = ir.IntType(32), ir.FloatType()
    f16 = ir.VectorType(f32, 16)
    cols = list(vecs) + [ir.Constant(f16, [0.0] * 16)] * (8 - len(vecs))
    rows_of = [list(range(16)) for _ in cols]    # the row each lane belongs to
    width = 1       # adjacent lanes of one row in the current vectors
    while width < 8:
        nxt, nxt_rows = [], []
        for k in range(0, len(cols), 2):
            a, b, ra, rb = cols[k], cols[k + 1], rows_of[k], rows_of[k + 1]
            groups = 16 // width        # row groups of `width` lanes; merge group g of a with g of b
            for half in range(2):
                idx = []
                for g in range(half * groups // 2, (half + 1) * groups // 2):
                    idx += [g * width + t for t in range(width)] + [16 + g * width + t for t in range(width)]
                nxt.append(builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(i32, 16), idx)))
                nxt_rows.append([(ra + rb)[i] for i in idx])
        # the next round pairs vectors holding the same rows: half 0 of pair k with half 0 of pair k+1
        order = [k + h for h in range(2) for k in range(0, len(nxt), 2)]
        cols, rows_of = [nxt[k] for k in order], [nxt_rows[k] for k in order]
        width *= 2
    rows = [None] * 16
    for v, r in zip(cols, rows_of):      # each holds two rows of 8 lanes
        for h in range(2):
            rows[r[8 * h]] = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(i32, 8), [8 * h + t for t in range(8)]))
    return rows
