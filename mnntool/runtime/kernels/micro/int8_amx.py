"""The int8 GEMM of int8_gemm on Intel AMX tiles, where the host has them (amx_host.available()).

AMX multiplies whole tiles: TDPBSUD adds to a 16 x 16 int32 tile C the products of a 16 x 64 byte tile A
(signed) and a 16 x 64 byte tile B (unsigned) read as 16 rows of K/4 x 4 bytes, C[m, n] += sum_k
sum_i A[m, 4k + i] * B[k, 4n + i]: 1024 multiply-adds of 4 bytes an instruction, 16 VPDPBUSDs' work.
B's layout is the one the VNNI path already packs its activations in (int8_gemm.pixel_blocks: per
16 pixels, K/4 rows of 16 words of 4 input bytes, u8 = q + 128 + zero point), so a pixel block's 16
consecutive rows are a B tile at a row stride of 64 bytes, unchanged; the weights (s8) are A, packed
here as [OC/32][K/64][2][16 rows][64 bytes], zero past K and OC. The sign convention is VPDPBUSD's
(u8 activations x s8 weights), so the int32 sums are the VNNI kernel's, and the epilogue is its own
(int8_gemm._store_ir): the output bytes are the same.

The tile: 32 channels x 32 pixels in four C tiles (tmm0..3), two weight tiles (tmm4, 5) and two pixel
blocks (tmm6, 7) a K step of 64, in one inline-asm block (tilezero, the K loop, tilestored of C to a
4 KB buffer), the tile configuration loaded once for a run of tiles (`_begin`: LDTILECFG; `_end`:
TILERELEASE): LLVM's tile intrinsics need its tile-configuration pass and AMX-enabled target features,
inline asm needs neither (it assembles on any x86-64 host; it runs only where amx_host allows). The K
tail (K/4 not a multiple of 16) reads whole 16-row tiles: rows past K meet zero weights, so they add
nothing; the activations carry AMX_SLACK bytes past their last block for the last tile's over-read.
A stride-1 or strided window on C/4 a multiple of 16 reads the quantized grid in place
(gemm_amx_planes, as int8_gemm.gemm_planes). Used from K = AMX_MIN_K (`min_k`), below which VNNI's
kernels stay faster (measured on an Emerald Rapids Xeon: tmp_dev/notes/amx.md).
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange, types, intrinsic

from .int8_gemm import EP_ROWS, NO_TABLE, _store_ir
from .llvm_ir import data_of

OCT, PXT = 32, 32           # the tile: channels x pixels (2 x 2 AMX tiles of 16 x 16)
STEP = 64                   # K bytes a step (16 rows of 4 bytes)
AMX_SLACK = 1024            # bytes readable past the activations' last block (one 16-row tile)
BUF = 1024 + 16             # int32 words of a tile's buffer: C (4 x 16 x 16), then the 64-byte tile config
CHUNK_MAX = 64              # tiles a parallel iteration runs at most (`chunk_of`)
AMX_MIN_K = 256             # AMX for K (padded to 4) from this (MNNTOOL_AMX_MIN_K overrides; `amx_weights`)
assert EP_ROWS % OCT == 0   # the epilogue rows (Int8Weights.ep) hold whole tiles of this kernel


def tile_config() -> bytes:
    """LDTILECFG's 64 bytes: palette 1, all eight tiles 16 rows x 64 bytes."""
    cfg = bytearray(64)
    cfg[0] = 1
    for t in range(8):
        cfg[16 + 2 * t] = 64            # colsb, u16 little-endian
        cfg[48 + t] = 16                # rows
    return bytes(cfg)


_ASM = "\n\t".join([
    "tilezero %tmm0", "tilezero %tmm1", "tilezero %tmm2", "tilezero %tmm3",
    "movq $$64, $1",
    "testq $4, $4",
    "jle 2f",
    "1:",
    "tileloadd ($2,$1,1), %tmm4",           # weights: channels 0..15, this step's 64 bytes
    "tileloadd 1024($2,$1,1), %tmm5",       # channels 16..31
    "addq $$2048, $2",
    "movq ($3), $0",
    "addq $8, $0",
    "tileloadd ($0,$10,1), %tmm6",          # pixel block 0: 16 rows of 16 words
    "movq ($3), $0",
    "addq $9, $0",
    "tileloadd ($0,$10,1), %tmm7",          # pixel block 1
    "tdpbsud %tmm6, %tmm4, %tmm0",          # C[o, p] += A (s8) . B (u8), Intel: tdpbsud tmm0, tmm4, tmm6
    "tdpbsud %tmm7, %tmm4, %tmm1",
    "tdpbsud %tmm6, %tmm5, %tmm2",
    "tdpbsud %tmm7, %tmm5, %tmm3",
    "addq $$8, $3",
    "decq $4",
    "jnz 1b",
    "2:",
    "tilestored %tmm0, ($11,$1,1)",
    "tilestored %tmm1, 1024($11,$1,1)",
    "tilestored %tmm2, 2048($11,$1,1)",
    "tilestored %tmm3, 3072($11,$1,1)",
])
# $0, $1 scratch; $2 weights, $3 step offsets, $4 steps (modified: outputs tied to inputs 5, 6, 7);
# $8, $9 the two pixel blocks' bases, $10 their row stride in bytes, $11 the buffer. The tile configuration
# is loaded once per run of tiles (_begin, a parallel iteration's) and released after (_end): LDTILECFG and
# TILERELEASE per tile cost more than a short K's products (K = 64: 1.5x VNNI's time, Xeon EMR)
_CONSTRAINTS = "=&r,=&r,=r,=r,=r,2,3,4,r,r,r,r,~{memory},~{dirflag},~{fpsr},~{flags}"


@intrinsic
def _begin(typingctx, buf):
    """LDTILECFG from buf's last 64 bytes (the configuration written there first): before a run of
    _products calls in one thread, `_end` after them. Nothing else in the process uses the tiles, so
    the configuration and the tiles stay as the asm blocks leave them between these calls."""
    from llvmlite import ir
    sig = types.void(buf)

    def codegen(context, builder, sig, args):
        from .float_gemm import _asm_parser
        _asm_parser()
        i8, i64 = ir.IntType(8), ir.IntType(64)
        bp = builder.bitcast(data_of(context, builder, sig.args[0], args[0]), i8.as_pointer())
        cfg_t = ir.ArrayType(i8, 64)
        cfg = builder.gep(bp, [ir.Constant(i64, 4096)])
        builder.store(ir.Constant(cfg_t, bytearray(tile_config())), builder.bitcast(cfg, cfg_t.as_pointer()))
        builder.asm(ir.FunctionType(ir.VoidType(), [i64]), "ldtilecfg ($0)", "r,~{memory},~{dirflag},~{fpsr},~{flags}",
                    [builder.ptrtoint(cfg, i64)], True)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _end(typingctx, buf):
    """TILERELEASE: the tiles back to their initial state (buf only orders it after the last store)."""
    from llvmlite import ir
    sig = types.void(buf)

    def codegen(context, builder, sig, args):
        from .float_gemm import _asm_parser
        _asm_parser()
        builder.asm(ir.FunctionType(ir.VoidType(), []), "tilerelease", "~{memory},~{dirflag},~{fpsr},~{flags}", [],
                    True)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _products(typingctx, x, x0, x1, xs, w, woff, steps, nsteps, buf):
    """buf[:1024] = the int32 sums of 32 channels x 32 pixels: tile t = 2 * (channel half) + pixel block
    at buf[256 t:], row = channel (16 words a row, one per pixel); x's pixel blocks at byte offsets x0
    and x1, a step's 16 rows at + steps[s] bytes, xs bytes apart; weights at byte woff (2048 a step).
    Between _begin and _end."""
    from llvmlite import ir
    sig = types.void(x, types.intp, types.intp, types.intp, w, types.intp, steps, types.intp, buf)

    def codegen(context, builder, sig, args):
        from .float_gemm import _asm_parser
        _asm_parser()
        xa, x0_, x1_, xs_, wa, wo, sa, ns, ba = args
        a = sig.args
        i8, i64 = ir.IntType(8), ir.IntType(64)
        i8p = i8.as_pointer()
        xb = builder.bitcast(data_of(context, builder, a[0], xa), i8p)
        wp = builder.gep(builder.bitcast(data_of(context, builder, a[4], wa), i8p), [wo])
        sp = data_of(context, builder, a[6], sa)
        bp = builder.bitcast(data_of(context, builder, a[8], ba), i8p)
        addr = lambda p: builder.ptrtoint(p, i64)  # noqa: E731
        ins = [addr(wp), addr(sp), ns, addr(builder.gep(xb, [x0_])), addr(builder.gep(xb, [x1_])), xs_, addr(bp)]
        fty = ir.FunctionType(ir.LiteralStructType([i64] * 5), [i64] * 7)
        builder.asm(fty, _ASM, _CONSTRAINTS, ins, True)
        return context.get_dummy_value()
    return sig, codegen


def _group_sums(builder, bp, g_):
    """The 16 int32 x 16 vectors of channel group g (8 channels, both 16-pixel halves) in the tile's
    4 KB sum buffer at bp, in _store_ir's order: group g is channel half g // 2 (tiles 2 (g // 2) + v),
    rows 8 (g % 2) of it. Codegen shared by _store and _store_planes."""
    from llvmlite import ir
    i64, v16 = ir.IntType(64), ir.VectorType(ir.IntType(32), 16)
    const = lambda v: ir.Constant(i64, v)   # noqa: E731
    base = builder.add(builder.mul(builder.ashr(g_, const(1)), const(512)),
                       builder.mul(builder.and_(g_, const(1)), const(128)))
    new = []
    for o in range(8):
        for v in range(2):
            at = builder.add(base, const(256 * v + 16 * o))
            new.append(builder.load(builder.bitcast(builder.gep(bp, [at]), v16.as_pointer()), align=4))
    return new


@intrinsic
def _store(typingctx, buf, g, out, ooff, ostride, left, rows, ep, epf, tab):
    """Channels 8g..8g+7 of the tile's sums in buf through int8_gemm's epilogue (_store_ir) to
    out[ooff + o * ostride + p], p < left, o < rows; ep = (scale, bias) rows at channel 8g."""
    from llvmlite import ir
    sig = types.void(buf, types.intp, out, types.intp, types.intp, types.intp, types.intp, ep, epf, tab)

    def codegen(context, builder, sig, args):
        ba, g_, oa, oo, os_, left_, rows_, epa, epfa, taba = args
        a = sig.args
        const = lambda v: ir.Constant(ir.IntType(64), v)   # noqa: E731
        new = _group_sums(builder, data_of(context, builder, a[0], ba), g_)
        op = data_of(context, builder, a[2], oa, oo)
        blocks = [(const(16 * v), builder.sub(left_, const(16 * v))) for v in range(2)]
        _store_ir(context, builder, new, op, os_, blocks, rows_, a[7], epa, epfa, data_of(context, builder, a[9], taba))
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _store_planes(typingctx, buf, g, out, o0, o1, ostride, n0, n1, b0, b1, rows, ep, epf, tab):
    """_store for gemm_amx_planes' virtual pixel blocks (int8_gemm.plane_blocks): block v's output pixels
    (lanes in the mask b_v, n_v of them) packed and stored from out[o * ostride + o_v]."""
    sig = types.void(buf, types.intp, out, types.intp, types.intp, types.intp, types.intp, types.intp, types.intp,
                     types.intp, types.intp, ep, epf, tab)

    def codegen(context, builder, sig, args):
        ba, g_, oa, o0_, o1_, os_, n0_, n1_, b0_, b1_, rows_, epa, epfa, taba = args
        a = sig.args
        new = _group_sums(builder, data_of(context, builder, a[0], ba), g_)
        op = data_of(context, builder, a[2], oa)
        _store_ir(context, builder, new, op, os_, [(o0_, n0_), (o1_, n1_)], rows_, a[11], epa, epfa,
                  data_of(context, builder, a[13], taba), bits=[b0_, b1_])
        return context.get_dummy_value()
    return sig, codegen


@njit(parallel=True, cache=True)
def gemm_amx_planes(g, wa, steps, xs, oc, ep, epf, out, tab, blk, chunk):
    """int8_gemm.gemm_planes on AMX tiles: the grid g (flat words, int8_conv.quantize_planes) of a window
    whose K steps of 16 words are each one tap's 16 consecutive channel words (C/4 a multiple of 16), a
    step's rows `xs` bytes apart (one plane), the step's first word at steps[s] bytes from the block's
    first virtual pixel; blk as gemm_planes' (two 16-pixel blocks a tile)."""
    P = out.shape[1]
    nb = blk.shape[0]
    npt, nob = (nb + 1) // 2, (oc + OCT - 1) // OCT
    ns = steps.shape[0]
    of = out.reshape(-1)
    scale, bias = ep
    nt = nob * npt
    for c in prange((nt + chunk - 1) // chunk):
        buf = np.empty(BUF, np.int32)
        _begin(buf)
        for t in range(c * chunk, min(nt, c * chunk + chunk)):
            ob, pt = tile_at(t, nob, npt, oc <= P)
            s0 = 2 * pt
            s1 = min(s0 + 1, nb - 1)
            n1 = blk[s1, 3] if s0 + 1 < nb else 0
            _products(g, blk[s0, 0] * 4, blk[s1, 0] * 4, xs, wa, ob * ns * 2 * 1024, steps, ns, buf)
            for q in range(OCT // 8):
                o0 = ob * OCT + 8 * q
                if o0 < oc:
                    _store_planes(buf, q, of, o0 * P + blk[s0, 1], o0 * P + blk[s1, 1], P, blk[s0, 3], n1,
                                  blk[s0, 2], blk[s1, 2], oc - o0, (scale[o0:], bias[o0:]), epf, tab)
        _end(buf)


@njit(cache=True)
def products_all(x, wa, steps, k4, oc, out):
    """out (OC, P) int32: gemm_amx's sums without its epilogue, every tile (tests and tmp_dev/amx_check:
    the integer products checked exactly, where the epilogue's float conversion would round them)."""
    P = out.shape[1]
    npt, nob = (P + PXT - 1) // PXT, (oc + OCT - 1) // OCT
    ns = steps.shape[0]
    buf = np.empty(BUF, np.int32)
    _begin(buf)
    for ob in range(nob):
        for pt in range(npt):
            b0 = pt * 2 * k4 * 64
            _products(x, b0, b0 + k4 * 64, 64, wa, ob * ns * 2 * 1024, steps, ns, buf)
            for o in range(min(OCT, oc - ob * OCT)):
                for p in range(min(PXT, P - pt * PXT)):
                    out[ob * OCT + o, pt * PXT + p] = buf[(2 * (o // 16) + p // 16) * 256 + (o % 16) * 16 + p % 16]
    _end(buf)


@njit(cache=True, inline="always")
def tile_at(t, nob, npt, pixels_major):
    """(channel block, pixel tile) of the t-th tile. Pixel tiles outer where the weights are the smaller
    operand (OC <= P): a pixel tile's activations (32 x K bytes) stay in L1 while every channel block's
    weights pass, where channel blocks outer streamed all the activations (3136 x 576 bytes for a 3x3
    layer on 64 channels at 56x56: more than L2) once per channel block; else channel blocks outer."""
    if pixels_major:
        return t % nob, t // nob
    return t // npt, t % npt


@njit(parallel=True, cache=True)
def gemm_amx(x, wa, steps, k4, oc, ep, epf, out, tab, chunk):
    """out (OC, P) float from the packed activations (int8_gemm.pixel_blocks' layout, AMX_SLACK bytes
    readable past them) and AMX-packed weights (`AmxWeights`); ep, epf, tab as int8_gemm.gemm_vnni's;
    `chunk` tiles a parallel iteration (one buffer and one tile configuration for them)."""
    P = out.shape[1]
    npt, nob = (P + PXT - 1) // PXT, (oc + OCT - 1) // OCT
    ns = steps.shape[0]
    of = out.reshape(-1)
    scale, bias = ep
    nt = nob * npt
    for c in prange((nt + chunk - 1) // chunk):
        buf = np.empty(BUF, np.int32)
        _begin(buf)
        for t in range(c * chunk, min(nt, c * chunk + chunk)):
            ob, pt = tile_at(t, nob, npt, oc <= P)
            b0 = pt * 2 * k4 * 64
            _products(x, b0, b0 + k4 * 64, 64, wa, ob * ns * 2 * 1024, steps, ns, buf)
            for g in range(OCT // 8):
                o0 = ob * OCT + 8 * g
                if o0 < oc:
                    _store(buf, g, of, o0 * P + pt * PXT, P, P - pt * PXT, oc - o0, (scale[o0:], bias[o0:]), epf,
                           tab)
        _end(buf)


def pack_weights(wq: np.ndarray) -> np.ndarray:
    """(OC, K) int8 -> [OC/32][K/64][2][16][64] int8 (A tiles, zero past K and OC), flat."""
    oc, k = wq.shape
    rows, kp = -(-oc // OCT) * OCT, -(-k // STEP) * STEP
    full = np.zeros((rows, kp), np.int8)
    full[:oc, :k] = wq
    return np.ascontiguousarray(full.reshape(rows // OCT, 2, 16, kp // STEP, STEP).transpose(0, 3, 1, 2, 4)).reshape(-1)


def block_steps(k4: int) -> np.ndarray:
    """The byte offsets of the K steps within a pixel block (16 rows of 64 bytes each)."""
    return np.arange(-(-k4 // 16), dtype=np.int64) * 1024


def slack_blocks(k4: int) -> int:
    """Extra 16-pixel blocks (k4 * 64 bytes each) that hold AMX_SLACK bytes past the last one."""
    return -(-AMX_SLACK // (k4 * 64))


class AmxWeights:
    """An int8_gemm.Int8Weights' weights packed for the AMX tile; matmul as Int8Weights.matmul's."""

    def __init__(self, weights, wq: np.ndarray, work: int, threads: int):
        oc, k = wq.shape
        self.oc, self.k4 = oc, weights.k4
        if -(-k // 4) != self.k4:
            raise ValueError(f"weights of K {k} for a tile of {self.k4} words")
        self.data = pack_weights(wq)
        self.steps = block_steps(self.k4)
        self.ep = weights.ep
        self.slack_blocks = slack_blocks(self.k4)
        from .. import sized
        # AMX does 64 of VNNI's 16-lane multiply-adds' work per element operation of sized's measure
        self.gemm = sized(gemm_amx, work // 4, threads)
        self.grid_gemm = sized(gemm_amx_planes, work // 4, threads)
        self.grid_steps = self.plane_bytes = None
        self.threads = threads

    def chunk(self, pixel_tiles: int) -> int:
        """Tiles a parallel iteration runs (`chunk_of`)."""
        return chunk_of(-(-self.oc // OCT) * pixel_tiles, self.threads)

    def matmul(self, x: np.ndarray, epf: tuple, out: np.ndarray, tab: np.ndarray = NO_TABLE) -> None:
        """out (OC, P) float32 from x: the blocks and at least AMX_SLACK bytes past them."""
        self.gemm(x, self.data, self.steps, self.k4, self.oc, self.ep, epf, out, tab,
                  self.chunk(-(-out.shape[1] // PXT)))

    def matmul_grid(self, g: np.ndarray, offs: np.ndarray, epf: tuple, out: np.ndarray, blk: np.ndarray,
                    tab: np.ndarray = NO_TABLE) -> None:
        """Int8Weights.matmul_grid on AMX (gemm_amx_planes): offs as there, C/4 a multiple of 16
        (`grid_ok`), so each K step is one tap's 16 channel words, a plane apart."""
        if self.grid_steps is None:
            self.grid_steps = np.ascontiguousarray(offs[::16] * 4, np.int64)
            self.plane_bytes = int(offs[1] - offs[0]) * 4
        self.grid_gemm(g, self.data, self.grid_steps, self.plane_bytes, self.oc, self.ep, epf, out, tab, blk,
                       self.chunk(-(-blk.shape[0] // 2)))


def chunk_of(tiles: int, threads: int) -> int:
    """Tiles per parallel iteration: all of them on one thread (one tile configuration a call), else
    about four iterations a thread (the work balanced), at most CHUNK_MAX."""
    if threads <= 1:
        return max(1, tiles)
    return max(1, min(CHUNK_MAX, tiles // (4 * threads)))


def min_k() -> int:
    """The smallest K (input channels x window, padded to 4) that runs on AMX: below it a tile's fixed
    cost (the C tiles stored and read back by the epilogue) outweighs the faster products, and the VNNI
    kernels keep their own layouts (the grid, channels in the lanes). Xeon (Emerald Rapids), 1 thread,
    kernel alone AMX/VNNI time: K 64-68 1.5-1.9, 108-148 1.1-1.2, 260 1.0, 576 0.59, 1152+ 0.44-0.55
    (a tile configuration per tile then); MNNTOOL_AMX_MIN_K overrides."""
    from ...host_tuning import env_number
    v = env_number("MNNTOOL_AMX_MIN_K")     # a mistyped value is an error, as the other tuning variables
    return AMX_MIN_K if v is None else v


def grid_ok(c4: int, direct: bool) -> bool:
    """Whether a window's GEMM reads the quantized grid in place on AMX (gemm_amx_planes): each K step
    of 16 words one tap's channel words, so C/4 a multiple of 16 (64, 128, ... channels)."""
    return not direct and c4 % 16 == 0


def amx_weights(weights, wq: np.ndarray, work: int, threads: int):
    """AmxWeights for the int8 convolution when this process may use AMX (amx_host) and its K is at
    least `min_k()`, else None (the VNNI path, unchanged)."""
    from ..amx_host import available
    if not available() or wq.shape[1] < min_k():
        return None
    return AmxWeights(weights, wq, work, threads)


def reference_products(x: np.ndarray, wq: np.ndarray, k4: int, pixels: int) -> np.ndarray:
    """The int32 sums (OC, pixels) the tile computes, in NumPy from the same layouts: x the packed
    blocks (uint8, [blocks][k4][16][4]), wq (OC, K <= 4 k4) int8. For the tests' layout checks."""
    blocks = -(-pixels // 16)
    cols = x[:blocks * k4 * 64].reshape(blocks, k4, 16, 4).transpose(0, 2, 1, 3).reshape(blocks * 16, k4 * 4)
    w = np.zeros((wq.shape[0], k4 * 4), np.int64)
    w[:, :wq.shape[1]] = wq
    return (w @ cols[:pixels].astype(np.int64).T).astype(np.int32)


def twin_products(x: np.ndarray, wa: np.ndarray, k4: int, oc: int, pixels: int) -> np.ndarray:
    """The tile's blocking in NumPy: per 32 x 32 tile and K step, the A tiles read from `pack_weights`'
    layout, B tiles of 16 rows at stride 64 from the blocks (past k4 into the next block or the slack,
    as the asm does), TDPBSUD's sum per 4 bytes. (OC, pixels) int32; checks the layouts without AMX."""
    ns = -(-k4 // 16)
    nob, npt = -(-oc // OCT), -(-pixels // PXT)
    xa = x.astype(np.int64)
    out = np.zeros((nob * OCT, npt * PXT), np.int64)
    a_all = wa.astype(np.int64).reshape(nob, ns, 2, 16, 64)
    for ob in range(nob):
        for pt in range(npt):
            for v in range(2):
                base = (2 * pt + v) * k4 * 64
                for s in range(ns):
                    b = xa[base + s * 1024: base + s * 1024 + 1024].reshape(16, 16, 4)     # rows k, pixel n, byte i
                    for h in range(2):
                        a = a_all[ob, s, h].reshape(16, 16, 4)                          # row m, word k, byte i
                        out[ob * OCT + 16 * h: ob * OCT + 16 * h + 16, pt * PXT + 16 * v: pt * PXT + 16 * v + 16] += \
                            np.einsum("mki,kni->mn", a, b)
    return out[:oc, :pixels].astype(np.int32)


def twin_planes(g: np.ndarray, wa: np.ndarray, steps: np.ndarray, xs: int, oc: int, blk: np.ndarray,
                pixels: int) -> np.ndarray:
    """gemm_amx_planes' blocking in NumPy: (OC, pixels) int32 sums, from the grid g's bytes at the blocks'
    first virtual pixels (blk[:, 0] words) + steps[s] bytes, 16 rows xs bytes apart, each block's output
    lanes (mask blk[:, 2]) packed from output pixel blk[:, 1]. Checks the step table without AMX."""
    gb = g.view(np.uint8).astype(np.int64)
    ns, nob = len(steps), -(-oc // OCT)
    a_all = wa.astype(np.int64).reshape(nob, ns, 2, 16, 64)
    out = np.zeros((nob * OCT, pixels), np.int64)
    for s in range(blk.shape[0]):
        base, first, bits, n = (int(v) for v in blk[s])
        acc = np.zeros((nob * OCT, 16), np.int64)
        for st in range(ns):
            at = base * 4 + int(steps[st])
            b = np.stack([gb[at + r * xs: at + r * xs + 64] for r in range(16)]).reshape(16, 16, 4)
            for ob in range(nob):
                for h in range(2):
                    acc[ob * OCT + 16 * h: ob * OCT + 16 * h + 16] += np.einsum("mki,kni->mn",
                                                                                a_all[ob, st, h].reshape(16, 16, 4), b)
        lanes = [j for j in range(16) if bits >> j & 1]
        assert len(lanes) == n
        out[:, first:first + n] = acc[:, lanes]
    return out[:oc].astype(np.int32)
