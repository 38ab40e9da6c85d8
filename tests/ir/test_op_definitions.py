"""Every op has one complete definition (ir/ops) that the runtime, the writer and MNN's schema agree on."""
import numpy as np
import pytest

from mnntool.ir.schema_tables import ENUMS, UNIONS
from mnntool.ir.graph import Node
from mnntool.ir.ops import REGISTRY, Val
from mnntool.runtime.kernels import KERNELS

OP_TYPES = set(ENUMS["OpType"][1])
PARAMS = set(UNIONS["OpParameter"])


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_definition_is_complete(name):
    d = REGISTRY[name]
    assert name in OP_TYPES, f"{name} is not an MNN OpType"
    assert d.param is None or d.param in PARAMS, f"{name}: {d.param} is not an OpParameter member"
    assert callable(d.infer) and callable(d.compute) and callable(d.flops)
    assert isinstance(d.inputs, tuple)


def test_every_kernel_has_a_definition():
    assert not set(KERNELS) - set(REGISTRY), set(KERNELS) - set(REGISTRY)


# one small case per op family: the definition's infer must give the shape its compute produces
CASES = [
    ("BinaryOp", {"opType": "ADD"}, [np.ones((2, 3), np.float32), np.ones(3, np.float32)]),
    ("BinaryOp", {"opType": "MOD"}, [np.array([-7, 7], np.int32), np.array([3, -3], np.int32)]),
    ("UnaryOp", {"opType": "ERF"}, [np.linspace(-2, 2, 5, dtype=np.float32)]),
    ("Reduction", {"operation": "SUM", "dim": [1], "keepDims": False}, [np.ones((2, 3, 4), np.float32)]),
    ("StridedSlice", {"fromType": 1}, [np.arange(10, dtype=np.float32), np.array([8]), np.array([1]),
                                       np.array([0]), np.array([-3])]),
    ("TopKV2", {"largest": True}, [np.array([[3, 1, 2]], np.float32), np.array([2], np.int32)]),
    ("GatherElements", {}, [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([[0, 2]], np.int32),
                            np.array([1], np.int32)]),
    ("OneHot", {"axis": -1}, [np.array([0, 2], np.int32), np.array([3], np.int32), np.float32(1), np.float32(0)]),
    ("Convolution", {"common": {"kernelX": 3, "kernelY": 3, "outputCount": 2, "padX": 1, "padY": 1, "group": 1}},
     [np.ones((1, 1, 4, 4), np.float32), np.ones((2, 1, 3, 3), np.float32)]),
    ("Pooling", {"type": "MAXPOOL", "kernelX": 2, "kernelY": 2, "strideX": 2, "strideY": 2},
     [np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)]),
    ("Interp", {"resizeType": 2, "outputHeight": 6, "outputWidth": 8}, [np.ones((1, 1, 3, 4), np.float32)]),
    ("LayerNorm", {"axis": [-1], "epsilon": 1e-5}, [np.arange(6, dtype=np.float32).reshape(2, 3)]),
    ("ReverseSequence", {"batchDim": 0, "seqDim": 1}, [np.arange(12, dtype=np.float32).reshape(3, 4),
                                                       np.array([4, 1, 2], np.int32)]),
]


@pytest.mark.parametrize("op,param,xs", CASES, ids=[f"{c[0]}-{k}" for k, c in enumerate(CASES)])
def test_infer_matches_compute(op, param, xs):
    node = Node(op, [f"i{k}" for k in range(len(xs))], ["y"] if op != "TopKV2" else ["v", "i"], param=param)
    d = REGISTRY[op]
    ins = [Val(np.shape(x), str(np.asarray(x).dtype), np.asarray(x)) for x in xs]
    outs = d.infer(node, ins)
    got = d.evaluate(node, list(xs))
    assert [tuple(v.shape) for v in outs] == [g.shape for g in got]
