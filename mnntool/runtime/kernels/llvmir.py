"""What the LLVM-IR micro-kernels (`vnni`, `fgemm`) share: the host check and IR building helpers."""
from __future__ import annotations

from numba import config
from numba.core import cgutils


def host_has(feature: str) -> bool:
    """`feature` (an LLVM name such as "avx512f") on the host, and Numba compiling for the host (not a
    portable NUMBA_CPU_NAME target)."""
    try:
        import llvmlite.binding as llvm
        features = llvm.get_host_cpu_features().flatten()
    except Exception:
        return False
    return f"+{feature}" in features.split(",") and config.CPU_NAME in (None, "host")


def data_of(context, builder, ty, value):
    """The data pointer of a Numba array value inside generated IR."""
    return cgutils.create_struct_proxy(ty)(context, builder, value=value).data


def declare(builder, name: str, ret, *args):
    """The intrinsic `name` (ret(*args)) in the builder's module."""
    from llvmlite import ir
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, list(args)), name)


def splat(builder, value, vt):
    """`value` in every lane of the vector type `vt`."""
    from llvmlite import ir
    zeros = ir.Constant(ir.VectorType(ir.IntType(32), vt.count), [0] * vt.count)
    lane = builder.insert_element(ir.Constant(vt, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(lane, ir.Constant(vt, ir.Undefined), zeros)
