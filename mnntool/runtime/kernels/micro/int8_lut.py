"""A table of up to 256 float32 values looked up by byte in registers: the fused table op (a SiLU) whose
output the file keeps float, in the int8 depthwise convolution's requantize pass.

The table is stored as four byte planes (`value_planes`: plane j holds byte j of every value), each
looked up like int8_gemm.lut_bytes' codes (two byte permutes over its 128-byte halves, AVX-512 VBMI,
and a select on the index's bit 7), and the four bytes of each value put back together by byte then
word interleaves. 64 lookups take ~40 vector instructions; the scalar loads they replace took ~1 ns
an output (EfficientNet-B0's SiLUs after its depthwise layers, read by the SE pools, one Zen 4 core).
A float table through two-register float permutes needs eight of them per 16 lanes, a gather ~24
cycles per 16 lanes on Zen 4.
"""
from __future__ import annotations

import numpy as np

from ..compile.jit import intrinsic, types
from .llvm_ir import data_of, declare, first_lanes, host_has, splat

PLANES = 256        # the planes argument's length in float32s: 4 planes of 256 bytes
# the byte permutes where the host has them (read when a caller compiles; else byte gathers, ~10x slower)
HAS_VBMI = host_has("avx512vbmi")


def value_planes(values) -> np.ndarray:
    """values (at most 256 float32) as `lut_values` reads them: a float32 array of 256 whose bytes are the
    four byte planes (plane j, bytes 256 j..256 j + 255: byte j of values[i], little-endian); indices past
    the table read its last value (mnn_math.lookup's clamp)."""
    v = np.asarray(values, np.float32).reshape(-1)
    if not 0 < v.size <= 256:
        raise ValueError(f"a table of {v.size} values (1 to 256)")
    full = np.full(256, v[-1], np.float32)
    full[:v.size] = v
    return np.ascontiguousarray(full.view(np.uint8).reshape(256, 4).T).reshape(-1).view(np.float32)


def _interleave(builder, a, b, width: int, high: bool):
    """x86's unpack (low or high halves of each 128-bit lane) of two 64-byte vectors in elements of
    `width` bits, written as the shuffle LLVM selects it from."""
    from llvmlite import ir
    n = 512 // width
    per = 128 // width                      # elements in a 128-bit lane
    half = per // 2
    idx = []
    for lane in range(n // per):
        for i in range(half):
            src = lane * per + i + (half if high else 0)
            idx += [src, n + src]
    vt = ir.VectorType(ir.IntType(width), n)
    a, b = builder.bitcast(a, vt), builder.bitcast(b, vt)
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), n), idx))


def _gathered(builder, base, ptrs, masks, mload, mstore):
    """lut_values without byte permutes: each plane's bytes gathered, shifted into place and or-ed."""
    from llvmlite import ir
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v16, l16, m16 = ir.VectorType(i32, 16), ir.VectorType(i64, 16), ir.VectorType(ir.IntType(1), 16)
    b16, pv = ir.VectorType(i8, 16), ir.VectorType(i8.as_pointer(), 16)
    f16 = ir.VectorType(ir.FloatType(), 16)
    gather = declare(builder, "llvm.masked.gather.v16i8.v16p0", b16, pv, i32, m16, b16)
    start = splat(builder, builder.ptrtoint(base, i64), l16)
    for p, m in zip(ptrs, masks):
        idx = builder.zext(builder.fptosi(builder.call(mload, [p, ir.Constant(i32, 4), m, ir.Constant(f16, [0.0] * 16)]),
                                          v16), l16)
        word = ir.Constant(v16, [0] * 16)
        for j in range(4):
            at = builder.inttoptr(builder.add(builder.add(start, idx), ir.Constant(l16, [256 * j] * 16)), pv)
            byte = builder.zext(builder.call(gather, [at, ir.Constant(i32, 1), m, ir.Constant(b16, [0] * 16)]), v16)
            word = builder.or_(word, builder.shl(byte, ir.Constant(v16, [8 * j] * 16)))
        builder.call(mstore, [builder.bitcast(word, f16), p, ir.Constant(i32, 4), m])


@intrinsic
def lut_values(typingctx, x, xo, n, planes):
    """x[xo + i] = table[int(x[xo + i])] for i < min(n, 64), in place: x holds indices 0..255 as floats,
    `planes` the table (value_planes). Byte permutes (AVX-512 VBMI) where the host has them."""
    from llvmlite import ir
    sig = types.void(x, types.intp, types.intp, planes)

    def codegen(context, builder, sig, args):
        xa, xo_, n_, pa = args
        i8, i32, i64, f32 = ir.IntType(8), ir.IntType(32), ir.IntType(64), ir.FloatType()
        f16, v16, m16 = ir.VectorType(f32, 16), ir.VectorType(i32, 16), ir.VectorType(ir.IntType(1), 16)
        b16, b64 = ir.VectorType(i8, 16), ir.VectorType(i8, 64)
        sel = lambda idx: ir.Constant(ir.VectorType(i32, len(idx)), list(idx))  # noqa: E731
        xp = data_of(context, builder, sig.args[0], xa, xo_)
        base = builder.bitcast(data_of(context, builder, sig.args[3], pa), i8.as_pointer())
        mload = declare(builder, "llvm.masked.load.v16f32.p0", f16, f16.as_pointer(), i32, m16, f16)
        mstore = declare(builder, "llvm.masked.store.v16f32.p0", ir.VoidType(), f16, f16.as_pointer(), i32, m16)
        perm = declare(builder, "llvm.x86.avx512.vpermi2var.qi.512", b64, b64, b64, b64)
        zero = ir.Constant(f16, [0.0] * 16)
        ptrs = [builder.bitcast(builder.gep(xp, [ir.Constant(i64, 16 * k)]), f16.as_pointer()) for k in range(4)]
        masks = [first_lanes(builder, builder.sub(n_, ir.Constant(i64, 16 * k))) for k in range(4)]
        if not HAS_VBMI:        # byte gathers (so that a library for a host without VBMI still compiles)
            _gathered(builder, base, ptrs, masks, mload, mstore)
            return context.get_dummy_value()
        small = [builder.trunc(builder.fptosi(builder.call(mload, [p, ir.Constant(i32, 4), m, zero]), v16), b16)
                 for p, m in zip(ptrs, masks)]
        # the 64 indices in the order the interleaves below undo: byte 16 k + m (128-bit lane k) holds
        # index 16 (m // 4) + 4 k + m % 4, so output vector m // 4 gets indices 16 (m // 4) .. + 15 in order
        packed = builder.shuffle_vector(builder.shuffle_vector(small[0], small[1], sel(range(32))),
                                        builder.shuffle_vector(small[2], small[3], sel(range(32))), sel(range(64)))
        order = [16 * (m // 4) + 4 * k + m % 4 for k in range(4) for m in range(16)]
        packed = builder.shuffle_vector(packed, ir.Constant(b64, ir.Undefined), sel(order))
        top = builder.icmp_signed("<", packed, ir.Constant(b64, [0] * 64))
        part = lambda j, k: builder.load(  # noqa: E731
            builder.bitcast(builder.gep(base, [ir.Constant(i64, 256 * j + 64 * k)]), b64.as_pointer()), align=4)
        planes_ = [builder.select(top, builder.call(perm, [part(j, 2), packed, part(j, 3)]),
                                  builder.call(perm, [part(j, 0), packed, part(j, 1)])) for j in range(4)]
        lo01, hi01 = (_interleave(builder, planes_[0], planes_[1], 8, h) for h in (False, True))
        lo23, hi23 = (_interleave(builder, planes_[2], planes_[3], 8, h) for h in (False, True))
        vals = [_interleave(builder, lo01, lo23, 16, False), _interleave(builder, lo01, lo23, 16, True),
                _interleave(builder, hi01, hi23, 16, False), _interleave(builder, hi01, hi23, 16, True)]
        for v, p, m in zip(vals, ptrs, masks):
            builder.call(mstore, [builder.bitcast(v, f16), p, ir.Constant(i32, 4), m])
        return context.get_dummy_value()
    return sig, codegen
