"""ONNX conformance: the ONNX backend node tests, run through `convert` and then mnntool's runtime or MNN's.

The cases come from the installed onnx package (`collect_testcases()`), are written once to a case
folder (model.onnx and one .npz per data set) and run by child processes, so that a crash or a hang in
a runtime costs one case, not the run. `report` turns the results into counts per op and group and
failures grouped by cause.
"""
from .cases import applicable, materialize, materialize_models, tolerance  # noqa: F401
