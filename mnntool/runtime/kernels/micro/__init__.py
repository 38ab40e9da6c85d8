"""The micro-kernels the op kernels run: LLVM-IR (AVX-512, VNNI) and Numba loops for GEMMs, GEMVs,
depthwise and Winograd convolutions, softmax and the shared epilogue. They register no op."""
