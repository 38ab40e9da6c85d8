"""How kernels get compiled: the Numba stand-ins that compile on first use (jit), the ahead-of-time
library built with pycc from aot_manifest.txt (aot, aot_build), and the CPU's features (host)."""
