"""numpy dtype names <-> MNN DataType names."""
import numpy as np

TO_MNN = {"float32": "DT_FLOAT", "float64": "DT_FLOAT", "float16": "DT_HALF", "int32": "DT_INT32",
          "int64": "DT_INT32", "bool": "DT_INT32", "uint8": "DT_UINT8", "int8": "DT_INT8",
          "int16": "DT_INT16"}
FROM_MNN = {"DT_FLOAT": "float32", "DT_DOUBLE": "float32", "DT_HALF": "float16", "DT_INT32": "int32",
            "DT_INT64": "int32", "DT_BOOL": "int32", "DT_UINT8": "uint8", "DT_INT8": "int8",
            "DT_INT16": "int16", "DT_INVALID": "float32"}


def to_mnn(dtype) -> str:
    return TO_MNN.get(str(np.dtype(dtype)), "DT_FLOAT")


def from_mnn(name: str) -> str:
    return FROM_MNN.get(name, "float32")
