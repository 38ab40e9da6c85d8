"""The tile-direction passes of Winograd F(4x4, 3x3) as AVX-512 LLVM IR, 16 tiles per call.

Across a row of tiles the inputs of tile t sit at 4t..4t+5 (stride 4, overlapping) and its outputs go
to 4t..4t+3. A map has 14 tiles to a row at 56x56 and fewer below, too short for Numba's vector loop,
which left these passes scalar (a third of a Winograd layer's time). Here shuffles turn four loads into
the six stride-4 operands (and back into four interleaved stores) for 16 tiles at once.
"""
from __future__ import annotations

from ..compile.jit import types, intrinsic

from .activation_ir import Finish
from .llvm_ir import data_of, declare, first_lanes, lane_bits, lanes, pointers, splat as splat_


def _bt4(builder, ir, d):
    """B^T d for F(4x4, 3x3): six vectors in, six out."""
    f16 = ir.VectorType(ir.FloatType(), 16)
    c = lambda x: splat_(builder, ir.Constant(ir.FloatType(), x), f16)  # noqa: E731
    flags = ("fast",)
    mul = lambda a, b: builder.fmul(a, b, flags=flags)  # noqa: E731
    add = lambda a, b: builder.fadd(a, b, flags=flags)  # noqa: E731
    sub = lambda a, b: builder.fsub(a, b, flags=flags)  # noqa: E731
    four, five, two = c(4.0), c(5.0), c(2.0)
    d0, d1, d2, d3, d4, d5 = d
    return [add(sub(mul(four, d0), mul(five, d2)), d4),
            add(sub(d3, mul(four, add(d1, d2))), d4),
            add(sub(mul(four, sub(d1, d2)), d3), d4),
            add(sub(mul(two, sub(d3, d1)), d2), d4),
            add(sub(mul(two, sub(d1, d3)), d2), d4),
            add(sub(mul(four, d1), mul(five, d3)), d5)]


@intrinsic
def bt4_cols(typingctx, x, xo, xs, lo, hi, rows, n, t, to, ts):
    """The column pass for 16 padded columns: d_k = x[xo + k*xs + lane], k = 0..5, read for lanes
    lo <= lane < hi of the rows whose bit k is set in `rows` and zero elsewhere (the padding, so the
    input needs no padded copy), and t[to + k*ts + lane] = (B^T d)_k for lanes < n. Numba had left
    18- and 30-wide rows (14x14 and 28x28 maps) scalar."""
    from llvmlite import ir
    sig = types.void(x, types.intp, types.intp, types.intp, types.intp, types.intp, types.intp, t, types.intp,
                     types.intp)

    def codegen(context, builder, sig, args):
        xa, xo_, xs_, lo_, hi_, rows_, n_, ta, to_, ts_ = args
        i32, i64 = ir.IntType(32), ir.IntType(64)
        f16, m16 = ir.VectorType(ir.FloatType(), 16), ir.VectorType(ir.IntType(1), 16)
        xp = data_of(context, builder, sig.args[0], xa, xo_)
        tp = data_of(context, builder, sig.args[7], ta, to_)
        mload = declare(builder, "llvm.masked.load.v16f32.p0", f16, f16.as_pointer(), i32, m16, f16)
        mstore = declare(builder, "llvm.masked.store.v16f32.p0", ir.VoidType(), f16, f16.as_pointer(), i32, m16)
        cols = lanes(builder, lo_, hi_)
        none = ir.Constant(m16, [0] * 16)
        zero = ir.Constant(f16, [0.0] * 16)
        at = lambda base, stride, k: builder.bitcast(builder.gep(base, [builder.mul(stride, ir.Constant(i64, k))]),  # noqa: E731
                                                     f16.as_pointer())
        d = []
        for k in range(6):
            used = builder.icmp_signed("!=", builder.and_(rows_, ir.Constant(i64, 1 << k)), ir.Constant(i64, 0))
            d.append(builder.call(mload, [at(xp, xs_, k), ir.Constant(i32, 4), builder.select(used, cols, none), zero]))
        keep = first_lanes(builder, n_)
        for k, v in enumerate(_bt4(builder, ir, d)):
            builder.call(mstore, [v, at(tp, ts_, k), ir.Constant(i32, 4), keep])
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def bt4_tiles(typingctx, row, ro, n, v, vo, vs):
    """For tiles t < n (<= 16): d_k = row[ro + 4t + k], k = 0..5, and v[vo + k*vs + t] = (B^T d)_k.
    row must be readable up to ro + 80."""
    from llvmlite import ir
    sig = types.void(row, types.intp, types.intp, v, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        ra, ro_, n_, va, vo_, vs_ = args
        i32, f32 = ir.IntType(32), ir.FloatType()
        f16 = ir.VectorType(f32, 16)
        rp = data_of(context, builder, sig.args[0], ra, ro_)
        vp = data_of(context, builder, sig.args[3], va, vo_)
        mstore = declare(builder, "llvm.masked.store.v16f32.p0", ir.VoidType(), f16, f16.as_pointer(), i32,
                         ir.VectorType(ir.IntType(1), 16))
        idx = lambda vals: ir.Constant(ir.VectorType(i32, 16), vals)  # noqa: E731
        ld = [builder.load(builder.bitcast(builder.gep(rp, [ir.Constant(ir.IntType(64), 16 * q)]), f16.as_pointer()),
                           align=4) for q in range(5)]
        # per half (tiles 0-7 from ld[0..1], 8-15 from ld[2..3]): lanes 0-7 operand k, lanes 8-15 operand k+1
        half = lambda a, b, k: builder.shuffle_vector(a, b, idx([4 * t + k for t in range(8)] +  # noqa: E731
                                                               [4 * t + k + 1 for t in range(8)]))
        lo01, lo23 = half(ld[0], ld[1], 0), half(ld[0], ld[1], 2)
        hi01, hi23 = half(ld[2], ld[3], 0), half(ld[2], ld[3], 2)
        first = idx(list(range(8)) + list(range(16, 24)))
        second = idx(list(range(8, 16)) + list(range(24, 32)))
        d0, d1 = builder.shuffle_vector(lo01, hi01, first), builder.shuffle_vector(lo01, hi01, second)
        d2, d3 = builder.shuffle_vector(lo23, hi23, first), builder.shuffle_vector(lo23, hi23, second)
        d4 = builder.shuffle_vector(d0, ld[4], idx(list(range(1, 16)) + [16]))     # row[4t + 4] = d0 a lane on
        d5 = builder.shuffle_vector(d1, ld[4], idx(list(range(1, 16)) + [17]))
        outs = _bt4(builder, ir, [d0, d1, d2, d3, d4, d5])
        mask = first_lanes(builder, n_)
        for k, o in enumerate(outs):
            at = builder.gep(vp, [builder.mul(vs_, ir.Constant(ir.IntType(64), k))])
            builder.call(mstore, [o, builder.bitcast(at, f16.as_pointer()), ir.Constant(i32, 4), mask])
        return context.get_dummy_value()
    return sig, codegen


def _interleave4(builder, ir, r):
    """Four vectors r[q][t] -> four vectors holding out[4t + q] for t = 0..15."""
    idx = lambda vals: ir.Constant(ir.VectorType(ir.IntType(32), 16), vals)  # noqa: E731
    lo = lambda a, b: builder.shuffle_vector(a, b, idx([x for t in range(8) for x in (t, t + 16)]))  # noqa: E731
    hi = lambda a, b: builder.shuffle_vector(a, b, idx([x for t in range(8, 16) for x in (t, t + 16)]))  # noqa: E731
    r01l, r01h, r23l, r23h = lo(r[0], r[1]), hi(r[0], r[1]), lo(r[2], r[3]), hi(r[2], r[3])
    quad_lo = idx([x for t in range(4) for x in (2 * t, 2 * t + 1, 2 * t + 16, 2 * t + 17)])
    quad_hi = idx([x for t in range(4, 8) for x in (2 * t, 2 * t + 1, 2 * t + 16, 2 * t + 17)])
    return [builder.shuffle_vector(r01l, r23l, quad_lo), builder.shuffle_vector(r01l, r23l, quad_hi),
            builder.shuffle_vector(r01h, r23h, quad_lo), builder.shuffle_vector(r01h, r23h, quad_hi)]


@intrinsic
def at4_block(typingctx, m, mo, ms, n, out, oo, os_, nrow, ncol, four_wide, bias, epf, on_grid):
    """The outputs of tiles t < n (<= 16): s[i][k] = m[mo + (6i + k)*ms + t], Y = A^T s A per tile, then
    finish(Y[r][q] + bias) (epf's activation bounds, then its int8 grid when on_grid) stored cropped to
    rows < nrow and columns < ncol. The 16 tiles are one tile row (out[oo + r*os_ + 4t + q]), or with
    four_wide four rows of four tiles (a 13..16-wide map: tile t at tile row t // 4)."""
    from llvmlite import ir
    sig = types.void(m, types.intp, types.intp, types.intp, out, types.intp, types.intp, types.intp, types.intp,
                     types.intp, types.float32, epf, types.intp)

    def codegen(context, builder, sig, args):
        ma, mo_, ms_, n_, oa, oo_, os__, nrow_, ncol_, four_, bias_, epfa, grid_ = args
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        f16, m16 = ir.VectorType(f32, 16), ir.VectorType(ir.IntType(1), 16)
        mp = data_of(context, builder, sig.args[0], ma, mo_)
        op = data_of(context, builder, sig.args[4], oa, oo_)
        mload = declare(builder, "llvm.masked.load.v16f32.p0", f16, f16.as_pointer(), i32, m16, f16)
        mstore = declare(builder, "llvm.masked.store.v16f32.p0", ir.VoidType(), f16, f16.as_pointer(), i32, m16)
        flags = ("fast",)
        mul = lambda a, b: builder.fmul(a, b, flags=flags)  # noqa: E731
        add = lambda a, b: builder.fadd(a, b, flags=flags)  # noqa: E731
        sub = lambda a, b: builder.fsub(a, b, flags=flags)  # noqa: E731
        c = lambda x: splat_(builder, ir.Constant(f32, x), f16)  # noqa: E731
        two, four, eight = c(2.0), c(4.0), c(8.0)

        def at4(s):
            p12, m12, p34, m34 = add(s[1], s[2]), sub(s[1], s[2]), add(s[3], s[4]), sub(s[3], s[4])
            return [add(add(s[0], p12), p34), add(m12, mul(two, m34)), add(p12, mul(four, p34)),
                    add(add(m12, mul(eight, m34)), s[5])]
        mask = first_lanes(builder, n_)
        zero = ir.Constant(f16, [0.0] * 16)
        s = [[builder.call(mload, [builder.bitcast(builder.gep(mp, [builder.mul(ms_, ir.Constant(i64, 6 * i + k))]),
                                                   f16.as_pointer()), ir.Constant(i32, 4), mask, zero])
              for k in range(6)] for i in range(6)]
        cols = [at4([s[i][k] for i in range(6)]) for k in range(6)]      # A^T down each column k
        bv = splat_(builder, bias_, f16)
        done = Finish(builder, epfa, builder.icmp_signed("!=", grid_, ir.Constant(i64, 0)))
        rows4 = builder.icmp_signed("!=", four_, ir.Constant(i64, 0))
        none = ir.Constant(m16, [0] * 16)
        for r in range(4):
            y = at4([cols[k][r] for k in range(6)])                      # then A across the row
            for j, v in enumerate(_interleave4(builder, ir, done.many([add(q, bv) for q in y]))):
                # vector j: columns 16j.. of row r, or (four_wide) columns 0..15 of row 4j + r
                at = builder.select(rows4, builder.mul(os__, ir.Constant(i64, 4 * j + r)),
                                    builder.add(builder.mul(os__, ir.Constant(i64, r)), ir.Constant(i64, 16 * j)))
                y_ = builder.select(rows4, ir.Constant(i64, 4 * j + r), ir.Constant(i64, r))
                cols_left = builder.select(rows4, ncol_, builder.sub(ncol_, ir.Constant(i64, 16 * j)))
                keep = builder.select(builder.icmp_signed("<", y_, nrow_), first_lanes(builder, cols_left), none)
                builder.call(mstore, [v, builder.bitcast(builder.gep(op, [at]), f16.as_pointer()), ir.Constant(i32, 4),
                                      keep])
        return context.get_dummy_value()
    return sig, codegen


def _table_ptrs(builder, ir, base, idx_ptr):
    """The 16 float pointers base + idx[lane], idx: 16 int64 in a table at idx_ptr."""
    l16 = ir.VectorType(ir.IntType(64), 16)
    return pointers(builder, base, builder.load(builder.bitcast(idx_ptr, l16.as_pointer()), align=8))


@intrinsic
def f2_in(typingctx, x, xo, idx, io, masks, mo, v, vo, vs, n):
    """Winograd F(2x2) input transform of 16 tiles (lanes < n stored): tap (i, j) of each tile's 4x4
    patch is a masked gather at x + xo + idx[io + 16*(4i+j) + lane] (masks[mo + 4i + j]: the lanes
    inside the image, the rest read as zero padding), and v[vo + (4a+b)*vs + lane] = (B^T d B)[a, b].
    For maps of 7x7 and less, where a tile row is 4 tiles: Numba had left these passes scalar."""
    from llvmlite import ir
    sig = types.void(x, types.intp, idx, types.intp, masks, types.intp, v, types.intp, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        xa, xo_, ia, io_, ma, mo_, va, vo_, vs_, n_ = args
        i32, i64 = ir.IntType(32), ir.IntType(64)
        f16, m16 = ir.VectorType(ir.FloatType(), 16), ir.VectorType(ir.IntType(1), 16)
        pv = ir.VectorType(ir.FloatType().as_pointer(), 16)
        gather = declare(builder, "llvm.masked.gather.v16f32.v16p0", f16, pv, i32, m16, f16)
        mstore = declare(builder, "llvm.masked.store.v16f32.p0", ir.VoidType(), f16, f16.as_pointer(), i32, m16)
        a = sig.args
        xp = data_of(context, builder, a[0], xa, xo_)
        ip = data_of(context, builder, a[2], ia, io_)
        mp = data_of(context, builder, a[4], ma, mo_)
        vp = data_of(context, builder, a[6], va, vo_)
        zero = ir.Constant(f16, [0.0] * 16)
        c = lambda k: ir.Constant(i64, k)  # noqa: E731
        d = [builder.call(gather, [_table_ptrs(builder, ir, xp, builder.gep(ip, [c(16 * k)])), ir.Constant(i32, 4),
                                   lane_bits(builder, builder.load(builder.gep(mp, [c(k)]))), zero]) for k in range(16)]
        flags = ("fast",)
        add = lambda p, q: builder.fadd(p, q, flags=flags)  # noqa: E731
        sub = lambda p, q: builder.fsub(p, q, flags=flags)  # noqa: E731
        bt2 = lambda e: [sub(e[0], e[2]), add(e[1], e[2]), sub(e[2], e[1]), sub(e[1], e[3])]  # noqa: E731
        cols = [bt2([d[4 * i + j] for i in range(4)]) for j in range(4)]     # B^T down each column j
        keep = first_lanes(builder, n_)
        for a_ in range(4):
            for b_, val in enumerate(bt2([cols[j][a_] for j in range(4)])):     # then B across
                at = builder.gep(vp, [builder.mul(vs_, c(4 * a_ + b_))])
                builder.call(mstore, [val, builder.bitcast(at, f16.as_pointer()), ir.Constant(i32, 4), keep])
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def f2_out(typingctx, m, mo, ms, n, out, oo, idx, io, masks, mk, bias, epf, on_grid):
    """Winograd F(2x2) output transform of 16 tiles (lanes < n): s_k = m[mo + k*ms + lane], Y = A^T s A,
    and out[oo + idx[io + 16*(2r+q) + lane]] = finish(Y[r, q] + bias) for the lanes in masks[mk + 2r + q]
    (the crop at the map's edge), as scatters."""
    from llvmlite import ir
    sig = types.void(m, types.intp, types.intp, types.intp, out, types.intp, idx, types.intp, masks, types.intp,
                     types.float32, epf, types.intp)

    def codegen(context, builder, sig, args):
        ma, mo_, ms_, n_, oa, oo_, ia, io_, ka, mk_, bias_, epfa, grid_ = args
        i32, i64 = ir.IntType(32), ir.IntType(64)
        f16, m16 = ir.VectorType(ir.FloatType(), 16), ir.VectorType(ir.IntType(1), 16)
        pv = ir.VectorType(ir.FloatType().as_pointer(), 16)
        mload = declare(builder, "llvm.masked.load.v16f32.p0", f16, f16.as_pointer(), i32, m16, f16)
        scatter = declare(builder, "llvm.masked.scatter.v16f32.v16p0", ir.VoidType(), f16, pv, i32, m16)
        a = sig.args
        mp = data_of(context, builder, a[0], ma, mo_)
        op = data_of(context, builder, a[4], oa, oo_)
        ip = data_of(context, builder, a[6], ia, io_)
        kp = data_of(context, builder, a[8], ka, mk_)
        c = lambda k: ir.Constant(i64, k)  # noqa: E731
        keep = first_lanes(builder, n_)
        zero = ir.Constant(f16, [0.0] * 16)
        s = [builder.call(mload, [builder.bitcast(builder.gep(mp, [builder.mul(ms_, c(k))]), f16.as_pointer()),
                                  ir.Constant(i32, 4), keep, zero]) for k in range(16)]
        flags = ("fast",)
        add = lambda p, q: builder.fadd(p, q, flags=flags)  # noqa: E731
        sub = lambda p, q: builder.fsub(p, q, flags=flags)  # noqa: E731
        at2 = lambda e: [add(add(e[0], e[1]), e[2]), sub(sub(e[1], e[2]), e[3])]  # noqa: E731
        cols = [at2([s[4 * i + j] for i in range(4)]) for j in range(4)]     # A^T down each column j
        finish = Finish(builder, epfa, builder.icmp_signed("!=", grid_, c(0)))
        bv = splat_(builder, bias_, f16)
        for r in range(2):
            for q, val in enumerate(at2([cols[j][r] for j in range(4)])):     # then A across
                k = 2 * r + q
                ptrs = _table_ptrs(builder, ir, op, builder.gep(ip, [c(16 * k)]))
                builder.call(scatter, [finish(add(val, bv)), ptrs, ir.Constant(i32, 4),
                                       lane_bits(builder, builder.load(builder.gep(kp, [c(k)])))])
        return context.get_dummy_value()
    return sig, codegen
