"""Permutes that keep runs of the last axis (kernels/ops/tensor.py permute_runs: one copy loop a run,
outer axes merged where they stay neighbours), against onnxruntime's Transpose: exactly equal (a copy).
Attention's qkv split, heads back to tokens, a window partition of short rows; a permute that moves nothing
(one run longer than RUN_MAX: NumPy's copy). And the one choice among the Permute kernels
(`permute_kernel`), each branch's output exactly NumPy's transpose."""
import numpy as np
import pytest
from onnx import helper as h

from mnntool import api
from mnntool.runtime.kernels.ops.tensor import permute_groups, permute_kernel
from mnntool.runtime.session import Session
from tests.conftest import one_node_files, ort_run

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("shape,perm", [((1, 197, 3, 8, 8), (2, 0, 3, 1, 4)), ((1, 8, 50, 16), (0, 2, 1, 3)),
                                        ((1, 4, 7, 4, 7, 8), (0, 1, 3, 2, 4, 5)), ((2, 3, 5, 6), (0, 1, 2, 3)),
                                        ((5, 7, 3, 6), (1, 0, 2, 3)), ((6, 1, 5, 2, 9), (3, 2, 1, 0, 4))])
@pytest.mark.parametrize("threads", [1, 2])
def test_permute_keeping_runs_matches_onnxruntime(tmp_path, shape, perm, threads):
    src, mnn = one_node_files(tmp_path, h.make_node("Transpose", ["x"], ["y"], perm=list(perm)), shape)
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    s = Session(api.load_graph(mnn), threads=threads)
    want = ort_run(src, {"x": x})["y"]
    for _ in range(2):
        np.testing.assert_array_equal(s.run({"x": x})["y"], want)


def test_groups_merge_neighbours_and_refuse_a_moved_last_axis():
    sizes, steps, run = permute_groups((1, 197, 3, 8, 8), (2, 0, 3, 1, 4))
    assert list(sizes) == [1, 1, 24, 197] and list(steps) == [0, 0, 8, 192] and run == 8     # (3, 8) merged
    sizes, steps, run = permute_groups((2, 4, 7, 4, 7, 12), (0, 1, 3, 2, 4, 5))
    assert list(sizes) == [1, 8, 4, 7] and list(steps) == [0, 2352, 84, 336] and run == 84
    assert permute_groups((2, 3, 4), (0, 2, 1)) is None


# (shape, perm, dtype, threads, work from which threads pay, the kernel chosen)
CHOICES = [((3, 5, 2), (1, 0, 2), "float32", 2, 0, "wide"),                  # runs of 2 floats: float64s
           ((4, 64, 48), (0, 2, 1), "float32", 1, 0, "blocked"),             # a batched 2-D transpose
           ((1, 197, 3, 8, 8), (2, 0, 3, 1, 4), "float32", 1, 0, "runs"),    # runs of 8 at one thread
           ((1, 197, 3, 8, 8), (2, 0, 3, 1, 4), "float32", 2, 0, "parallel_copy"),
           ((1, 197, 3, 8, 8), (2, 0, 3, 1, 4), "float32", 2, 10 ** 12, "runs"),    # threads do not pay
           ((2, 3, 4, 5, 6), (3, 2, 1, 0, 4), "float32", 2, 0, "runs"),      # five merged axes: past the copy's
           ((2, 3, 100), (1, 0, 2), "float32", 1, 0, "numpy"),               # runs over RUN_MAX
           ((1, 197, 3, 8, 8), (2, 0, 3, 1, 4), "int8", 1, 0, "numpy"),
           ((1, 197, 3, 8, 8), (2, 0, 3, 1, 4), "int8", 2, 0, "parallel_copy"),   # any dtype with threads
           ((5, 7, 3), (2, 1, 0), "float32", 1, 0, "numpy")]                 # the last axis moved


@pytest.mark.parametrize("shape,perm,dtype,threads,min_work,name", CHOICES)
def test_one_choice_of_permute_kernel(monkeypatch, shape, perm, dtype, threads, min_work, name):
    monkeypatch.setenv("MNNTOOL_PARALLEL_MIN_WORK", str(min_work))
    chosen, run = permute_kernel(shape, perm, dtype, threads)
    assert chosen == name
    x = (np.random.default_rng(1).standard_normal(shape) * 50).astype(dtype)
    out = np.empty([shape[a] for a in perm], dtype)
    run([x], [out])
    np.testing.assert_array_equal(out, x.transpose(perm))
