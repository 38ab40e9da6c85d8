"""GEMMs whose left operand is an activation: fully connected layers over many rows (a transformer's
linear layers, 128 tokens) and batched MatMul (attention's scores and context).

They ran on OpenBLAS. At 1 thread `float_gemm` is faster (128x256 @ 256x1024: 0.84 -> 0.70 ms), and at 2
threads OpenBLAS's pool and Numba's take each other's cores whenever the two alternate: a BERT-like
model ran no faster on 2 threads than on 1. Here the activation rows are packed per call as float_gemm's
"weights" ([M/8][K][8], a pass over M x K, small against the M x K x N multiply) and the right
operand is read in place as its pixel rows; a bias rides along as one more k (a row of ones in the
packed rows, the bias as the last row of the constant operand), since float_gemm's epilogue adds a bias
per output row, not per column.
"""
from __future__ import annotations

import numpy as np
from ..compile.jit import njit, prange, types, intrinsic

from .. import Scratch, direct, sized
from ..micro.llvm_ir import columns_to_rows, data_of, first_lanes, vector_ops
from ..micro.float_gemm import BY_BLOCK_X, OCB, epilogue_of, gemm_batched, gemm_panels, k_block, pack_panels, tile_count
from ..micro.epilogue import NO_POST


# multiply-adds below which one BLAS call costs less than a pack and a gemm call (1 thread: 16x32x256
# 4.8 against 6.6 us; at 64x64x256 the gemm wins, 23 against 27 us)
SMALL_GEMM = 1 << 20


@intrinsic
def _pack16(typingctx, a, ao, lda, rows, kn, out, oo):
    """out[oo + 8k + r] = a[ao + r*lda + k] for k < kn (<= 16), r < 8; rows r >= `rows` as zeros. Eight
    masked row loads, the 16 x 8 transpose in registers, sixteen 8-float stores (a scalar loop
    over the same took 1-2 cycles an element)."""
    from llvmlite import ir
    sig = types.void(a, types.intp, types.intp, types.intp, types.intp, out, types.intp)

    def codegen(context, builder, sig, args):
        aa, ao_, lda_, rows_, kn_, oa, oo_ = args
        i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
        f16, f8 = ir.VectorType(f32, 16), ir.VectorType(f32, 8)
        _, mload, _ = vector_ops(builder)
        ap = data_of(context, builder, sig.args[0], aa, ao_)
        op = data_of(context, builder, sig.args[5], oa, oo_)
        ks = first_lanes(builder, kn_)
        none = ir.Constant(ks.type, [0] * 16)
        zero = ir.Constant(f16, [0.0] * 16)
        cols = []
        for r in range(OCB):
            mask = builder.select(builder.icmp_signed("<", ir.Constant(i64, r), rows_), ks, none)
            at = builder.bitcast(builder.gep(ap, [builder.mul(ir.Constant(i64, r), lda_)]), f16.as_pointer())
            cols.append(builder.call(mload, [at, ir.Constant(i32, 4), mask, zero]))
        for k, row in enumerate(columns_to_rows(builder, cols)):
            # k rows past kn hold zeros from the masked loads; stored only while inside the block
            inside = builder.icmp_signed("<", ir.Constant(i64, k), kn_)
            with builder.if_then(inside):
                builder.store(row, builder.bitcast(builder.gep(op, [ir.Constant(i64, 8 * k)]), f8.as_pointer()), align=4)
        return context.get_dummy_value()
    return sig, codegen


@njit(parallel=True, cache=True)
def pack_rows(a, ones, out):
    """a (B, M, K) C-contiguous -> out flat [B][M/8][K + ones][8]: rows past M zero; with `ones`, a
    last k of 1.0."""
    nb, M, K = a.shape
    kp = K + ones
    nob = (M + OCB - 1) // OCB
    af = a.reshape(-1)
    for j in prange(nb * nob):
        b, ob = j // nob, j % nob
        base = j * kp * OCB
        rows = min(OCB, M - ob * OCB)
        for k0 in range(0, K, 16):
            _pack16(af, (b * M + ob * OCB) * K + k0, K, rows, min(16, K - k0), out, base + k0 * OCB)
        if ones:
            at = base + K * OCB
            for r in range(OCB):
                out[at + r] = 1.0 if r < rows else 0.0


class RowGemm:
    """y (M, N) = finish(a (M, K) @ b (K, N) + bias) for a constant b; a is packed on every call."""

    def __init__(self, b: np.ndarray, bias, act: int, grid, m: int, threads: int, post=NO_POST):
        k, n = b.shape
        self.m, self.n, self.ones = m, n, 1 if bias is not None else 0
        self.kp = k + self.ones
        right = np.empty((self.kp, n), np.float32)
        right[:k] = b
        if self.ones:
            right[k] = bias
        self.right = pack_panels(right)
        nob = -(-m // OCB)
        # the packed rows in a buffer all row GEMMs share: one per layer was cold at every run (ViT-tiny's
        # 48 layers: 7 MB of them)
        self.packed = Scratch("rowgemm_rows", (nob * self.kp * OCB,))
        self.zero = np.zeros(nob * OCB, np.float32)
        # all of k in one pass: k blocks kept the packed rows in L2 but read and wrote the whole output again
        # per block, which cost more (gemm_panels alone, 1 thread, GFLOP/s k-blocked -> one pass: ViT-base's
        # 197 x 768 x 3072 101 -> 107, 197 x 3072 x 768 104 -> 105, Whisper-tiny's 1500 x 384 x 1536 (5
        # blocks) 93 -> 110, 1500 x 1536 x 384 101 -> 106, 512 x 1024 x 4096 102 -> 112; 64 x 4096 x 4096
        # 102 / 100; tmp_dev/gemm/panels.py)
        self.kc = self.kp
        self.epf, self.grid = epilogue_of(act, grid, post)     # a fused activation in the IR epilogue
        packed = self.packed()
        self.pack = direct(sized(pack_rows, m * self.kp, threads), np.empty((1, m, k), np.float32), self.ones, packed)
        self.fn = direct(sized(gemm_panels, nob * OCB * n * self.kp // 16, threads), self.right, self.n, packed,
                         self.kp, self.kc, self.m, self.zero, self.epf, self.grid, np.empty(m * n, np.float32), self.n)

    def step(self):
        """A kernel's fn(inputs, outputs): inputs[0] (M*K floats, any shape and strides) times b into
        outputs[0] (C-contiguous: the planner's output buffers are). The flat views of the arrays of the run before are kept: the planner hands a step
        the same buffers run after run, and the reshapes cost ~0.2 us each (a tiny BERT's row GEMMs take
        2-3 us)."""
        pack, fn, packed_of, m, ones = self.pack, self.fn, self.packed, self.m, self.ones
        right, n, kp, kc, zero, epf, grid = self.right, self.n, self.kp, self.kc, self.zero, self.epf, self.grid
        memo = [None, None, None, None]     # input, output, their flat views (the input's: when contiguous)

        def run(inputs, outputs):
            x, y = inputs[0], outputs[0]
            if x is not memo[0]:
                memo[0], memo[2] = x, (x.reshape(1, m, -1) if x.flags.c_contiguous else None)
            if y is not memo[1]:
                memo[1], memo[3] = y, y.reshape(-1)
            rows = memo[2] if memo[2] is not None else np.ascontiguousarray(x).reshape(1, m, -1)
            packed = packed_of()
            pack(rows, ones, packed)
            fn(right, n, packed, kp, kc, m, zero, epf, grid, memo[3], n)
        return run


class BatchedMatMul:
    """out (B, M, N) = a (B, M, K) @ b (B, K, N), both activations, b C-contiguous."""

    def __init__(self, batches: int, m: int, k: int, n: int, threads: int):
        from ..micro.float_gemm import IDENTITY
        self.shape = (batches, m, k, n)
        nob = -(-m // OCB)
        self.wstride = nob * k * OCB
        self.packed = Scratch("rowgemm_rows", (batches * self.wstride,))
        self.zero = np.zeros(nob * OCB, np.float32)
        self.kc = k_block(k, nob * OCB, tile_count(n))
        self.by_block = k * n <= BY_BLOCK_X
        self.epf = IDENTITY
        self.pack = sized(pack_rows, batches * m * k, threads)
        self.fn = sized(gemm_batched, batches * nob * OCB * n * k // 16, threads)

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        nb, m, k, n = self.shape
        packed = self.packed()
        self.pack(np.ascontiguousarray(a), 0, packed)
        self.fn(b.reshape(-1), n, k * n, n, packed, self.wstride, k, self.kc, m, self.zero, self.epf, 0,
                out.reshape(-1), n, m * n, nb, self.by_block)
