"""A depthwise convolution over tokens, (B, H*W, C) in and out (plan/fuse_token_depthwise.py makes the
step): PVT-v2's MLP transposes its hidden tokens to (B, C, H, W) for a 3 x 3 depthwise convolution and
back (1 x 3136 x 256 on its first stage: two transposes of 3.2 MB, ~550 us at 1 thread on an AMD EPYC
Zen 4, beside ~330 us of convolution). With the channels innermost each tap is a multiply-add of
C-long rows, as the model's linear layers lay them out; no transpose.

The taps run in IR (AVX-512): 64 channels of up to four neighbouring output pixels in 16 registers
summed over the taps, the weights loaded once for the four; a loop of C-long multiply-adds in memory
(Numba's) spent its time loading and storing the sums (970 us for the layer above, this ~300)."""
from __future__ import annotations

import numpy as np
from ..compile.jit import intrinsic, njit, prange, types

from .. import PLAN_ONLY, sized, writes
from ..micro.epilogue import POST_GELU, POST_GELU_TANH, POST_HARDSWISH, POST_SIGMOID, POST_SILU
from ..micro.llvm_ir import data_of, declare, first_lanes, k_loop, splat, vector_ops

CHUNK = 4       # 16-lane vectors of channels a pixel keeps in registers
GROUP = 4       # output pixels summed together (the interior of a row)
BLOCK = 1024    # channels done along a whole row before the next
# activations (epilogue.POST_*) the step applies to its output: those without parameters
ACTIVATIONS = (POST_GELU_TANH, POST_GELU, POST_SILU, POST_SIGMOID, POST_HARDSWISH)


def _taps_ir(pixels: int, across: int = 1):
    """An intrinsic summing `pixels` output pixels: out[ob + p C + k] = clip(b[k] + sum_t w[wo[t] + k]
    x[xb + p ps + xo[t] + k], lo, hi) for channels c0 <= k < ce (of C). With `across` > 1 each t is a
    row of `across` taps C apart in x and w (stride 1, no dilation: ps = C), the row's pixels + across - 1
    input vectors loaded once for all its taps (3 x 3: 6 loads where 12 were)."""

    def taps(typingctx, x, xb, ps, w, b, xo, wo, nt, c, c0, ce, lo, hi, act, out, ob):
        from llvmlite import ir
        sig = types.void(x, types.intp, types.intp, w, b, xo, wo, types.intp, types.intp, types.intp, types.intp,
                         types.float32, types.float32, types.intp, out, types.intp)

        def codegen(context, builder, sig, args):
            from ..micro.activation_ir import VectorMath
            xa, xb_, ps_, wa, ba, xoa, woa, nt_, c_, c0_, ce_, lo_, hi_, act_, oa, ob_ = args
            f32, i32, i64 = ir.FloatType(), ir.IntType(32), ir.IntType(64)
            f16 = ir.VectorType(f32, 16)
            fma, mload, mstore = vector_ops(builder)
            vmax = declare(builder, "llvm.maxnum.v16f32", f16, f16, f16)
            vmin = declare(builder, "llvm.minnum.v16f32", f16, f16, f16)
            xp, wp, bp = (data_of(context, builder, sig.args[k], a) for k, a in ((0, xa), (3, wa), (4, ba)))
            xop, wop = data_of(context, builder, sig.args[5], xoa), data_of(context, builder, sig.args[6], woa)
            op = data_of(context, builder, sig.args[14], oa)
            vm = VectorMath(builder)
            four, zero = ir.Constant(i32, 4), ir.Constant(f16, [0.0] * 16)
            low, high = splat(builder, lo_, f16), splat(builder, hi_, f16)
            vec = lambda p, at: builder.bitcast(builder.gep(p, [at]), f16.as_pointer())  # noqa: E731
            pix = [builder.mul(ir.Constant(i64, p), ps_) for p in range(pixels + across - 1)]
            step = [builder.mul(ir.Constant(i64, j), c_) for j in range(across)]

            def chunk(k, _):
                cols = [builder.add(builder.add(c0_, k), ir.Constant(i64, 16 * h)) for h in range(CHUNK)]
                masks = [first_lanes(builder, builder.sub(ce_, col)) for col in cols]
                bias = [builder.call(mload, [vec(bp, col), four, m, zero]) for col, m in zip(cols, masks)]

                def tap(t, accs):
                    xo_ = builder.add(xb_, builder.load(builder.gep(xop, [t])))
                    wo_ = builder.load(builder.gep(wop, [t]))
                    new = list(accs)
                    for h, (col, m) in enumerate(zip(cols, masks)):
                        if across > 1:
                            ws = [builder.call(mload, [vec(wp, builder.add(builder.add(wo_, step[j]), col)), four, m,
                                                       zero]) for j in range(across)]
                            xs = [builder.call(mload, [vec(xp, builder.add(builder.add(xo_, pix[q]), col)), four, m,
                                                       zero]) for q in range(pixels + across - 1)]
                            for p in range(pixels):
                                for j in range(across):
                                    new[p * CHUNK + h] = builder.call(fma, [ws[j], xs[p + j], new[p * CHUNK + h]])
                            continue
                        wv = builder.call(mload, [vec(wp, builder.add(wo_, col)), four, m, zero])
                        for p in range(pixels):
                            at = builder.add(builder.add(xo_, pix[p]), col)
                            xv = builder.call(mload, [vec(xp, at), four, m, zero])
                            new[p * CHUNK + h] = builder.call(fma, [wv, xv, accs[p * CHUNK + h]])
                    return new
                accs = k_loop(builder, nt_, [bias[h] for _ in range(pixels) for h in range(CHUNK)], tap)

                def store(kind):
                    for p in range(pixels):
                        base = builder.add(ob_, builder.mul(ir.Constant(i64, p), c_))
                        for h, (col, m) in enumerate(zip(cols, masks)):
                            v = builder.call(vmin, [builder.call(vmax, [accs[p * CHUNK + h], low]), high])
                            v = vm.activate(kind, v, zero, zero) if kind else v
                            builder.call(mstore, [v, vec(op, builder.add(base, col)), four, m])
                # the activation after the transpose back (GELU in PVT's MLP): one branch a chunk
                done, plain = builder.append_basic_block("stored"), builder.append_basic_block("plain")
                switch = builder.switch(act_, plain)
                for kind in ACTIVATIONS:
                    block = builder.append_basic_block(f"act{kind}")
                    switch.add_case(ir.Constant(i64, kind), block)
                    builder.position_at_end(block)
                    store(kind)
                    builder.branch(done)
                builder.position_at_end(plain)
                store(0)
                builder.branch(done)
                builder.position_at_end(done)
                return []
            k_loop(builder, builder.sub(ce_, c0_), [], chunk, step=16 * CHUNK)
            return context.get_dummy_value()
        return sig, codegen
    taps.__name__ = f"_taps{pixels}x{across}"
    return intrinsic(taps)


_taps1, _taps4, _rows4 = _taps_ir(1), _taps_ir(GROUP), _taps_ir(GROUP, 3)


@njit(parallel=True, cache=True)
def depthwise_tokens(x, w, b, h, wd, c, kh, kw, sh, sw, pt, pl, dh, dw, oh, ow, lo, hi, act, batch, out):
    """out[n, y * ow + x, :] = clip(b + sum_ij w[i * kw + j] * x[n, iy * wd + ix, :], lo, hi) for taps
    (iy, ix) = (y sh - pt + i dh, x sw - pl + j dw) inside the h x wd map (zero padding), then the
    activation `act` (an epilogue.POST_* of ACTIVATIONS, 0 for none); x, w, out flat
    ((B, H*W, C), (kh*kw, C), (B, oh*ow, C)). A row's interior pixels (every tap across inside) go four
    at a time with shared tap offsets, the rest one by one; a layer wider than BLOCK channels a block at a
    time along the whole row (narrower ones measured best in one: 1 x 3136 x 256 ran slower in blocks)."""
    x_lo = min((pl + sw - 1) // sw, ow)
    x_hi = max(min((wd - 1 + pl - (kw - 1) * dw) // sw + 1, ow), x_lo)
    kk = kh * kw
    for ny in prange(batch * oh):
        n, y = ny // oh, ny % oh
        xo = np.empty(kk, np.int64)
        wo = np.empty(kk, np.int64)
        ro = np.empty(kh, np.int64)
        rw = np.empty(kh, np.int64)
        edge = np.empty(ow - (x_hi - x_lo), np.int64)         # the pixels whose taps leave the map across
        exo = np.empty((edge.shape[0], kk), np.int64)
        ewo = np.empty((edge.shape[0], kk), np.int64)
        ent = np.zeros(edge.shape[0], np.int64)
        xb = n * h * wd * c
        ob = (n * oh + y) * ow * c
        e = 0
        for xx in range(ow):
            if x_lo <= xx < x_hi:
                continue
            edge[e] = xx
            for i in range(kh):
                iy = y * sh - pt + i * dh
                if iy < 0 or iy >= h:
                    continue
                for j in range(kw):
                    ix = xx * sw - pl + j * dw
                    if ix < 0 or ix >= wd:
                        continue
                    exo[e, ent[e]] = (iy * wd + ix) * c
                    ewo[e, ent[e]] = (i * kw + j) * c
                    ent[e] += 1
            e += 1
        nt = 0      # the interior: offsets from the pixel's own column
        for i in range(kh):
            iy = y * sh - pt + i * dh
            if iy < 0 or iy >= h:
                continue
            for j in range(kw):
                xo[nt] = (iy * wd - pl + j * dw) * c
                wo[nt] = (i * kw + j) * c
                nt += 1
        rows = 0        # 3 wide, stride 1, no dilation: the interior's taps as rows of 3
        if kw == 3 and sw == 1 and dw == 1:
            for t in range(0, nt, 3):
                ro[rows] = xo[t]
                rw[rows] = wo[t]
                rows += 1
        for c0 in range(0, c, BLOCK):
            ce = min(c0 + BLOCK, c)
            for e in range(edge.shape[0]):
                _taps1(x, xb, 0, w, b, exo[e], ewo[e], ent[e], c, c0, ce, lo, hi, act, out, ob + edge[e] * c)
            xx = x_lo
            while xx + GROUP <= x_hi:
                if rows:
                    _rows4(x, xb + xx * c, c, w, b, ro, rw, rows, c, c0, ce, lo, hi, act, out, ob + xx * c)
                else:
                    _taps4(x, xb + xx * sw * c, sw * c, w, b, xo, wo, nt, c, c0, ce, lo, hi, act, out, ob + xx * c)
                xx += GROUP
            while xx < x_hi:
                _taps1(x, xb + xx * sw * c, 0, w, b, xo, wo, nt, c, c0, ce, lo, hi, act, out, ob + xx * c)
                xx += 1


def token_depthwise_step(node, ins, outs, settings):
    """The fused step: input (B, H*W, C) tokens; param taps (kh*kw, C), bias (C), the convolution's
    geometry, its ReLU/ReLU6 as a clip and the activation after it (act: an epilogue.POST_*, 0 for none)."""
    prm = node.param
    batch, _, c = ins[0].shape
    oh, ow = prm["out_hw"]
    w, b = np.ascontiguousarray(prm["taps"], np.float32).reshape(-1), np.ascontiguousarray(prm["bias"], np.float32)
    lo, hi = np.float32(prm["clip"][0]), np.float32(prm["clip"][1])
    act = int(prm.get("act", 0))
    (h, wd), (kh, kw), (sh, sw), (pt, pl), (dh, dw) = (prm[k] for k in ("hw", "kernel", "stride", "pad", "dilation"))
    fn = sized(depthwise_tokens, batch * oh * ow * c * kh * kw, settings.threads)

    def run(i, o):
        fn(np.ascontiguousarray(i[0], np.float32).reshape(-1), w, b, h, wd, c, kh, kw, sh, sw, pt, pl, dh, dw,
           oh, ow, lo, hi, act, batch, o[0].reshape(-1))
    return writes(run)


PLAN_ONLY["TokenDepthwise"] = token_depthwise_step
