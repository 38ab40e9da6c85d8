"""2x2 stride-2 pooling in one pass (ops.pool.pool2x2_s2) where every window is inside the input: against
torch's avg_pool2d / max_pool2d (average to 1e-6 of the largest value: fastmath may sum the four in another
order than torch; max exactly, and the same bits as the general row kernel it replaces there), at 1 and 2
threads; clipped windows keep the general kernel."""
import numpy as np
import pytest

from mnntool.ir.ops import Val
from mnntool.runtime.kernels.ops import pool
from mnntool.runtime.settings import Settings

torch = pytest.importorskip("torch")
F = torch.nn.functional


class Node:
    name = "p"

    def __init__(self, kind, ceil=False, pad=0):
        self.param = {"type": kind, "kernelX": 2, "kernelY": 2, "strideX": 2, "strideY": 2, "padX": pad,
                      "padY": pad, "padType": "CAFFE", "ceilModel": ceil}


@pytest.mark.parametrize("shape", [(1, 16, 56, 56), (2, 5, 7, 9), (1, 3, 14, 15)])
@pytest.mark.parametrize("kind", ["AVEPOOL", "MAXPOOL"])
@pytest.mark.parametrize("threads", [1, 2])
def test_matches_torch_and_the_row_kernel(monkeypatch, shape, kind, threads):
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    t = torch.from_numpy(x)
    ref = (F.avg_pool2d(t, 2, 2) if kind == "AVEPOOL" else F.max_pool2d(t, 2, 2)).numpy()
    calls = []
    monkeypatch.setattr(pool, "sized", _spy(pool.sized, calls))
    k = pool.pooling(Node(kind), [Val(x.shape)], [Val(ref.shape)], Settings(threads))
    y = np.full(ref.shape, np.nan, np.float32)
    k.fn([x], [y])
    assert calls == [pool.pool2x2_s2], "the one-pass kernel was not chosen"
    if kind == "MAXPOOL":
        assert np.array_equal(y, ref)
        general = np.full(ref.shape, np.nan, np.float32)
        pool.pool_rows(x, 2, 2, 2, 2, True, np.ones(ref.shape[2:], np.float32), general)
        assert np.array_equal(y.view(np.uint32), general.view(np.uint32))
    else:
        assert np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()


def _spy(sized, calls):
    """pool.sized, noting which kernel a pooling layer sizes."""
    def spy(fn, *a):
        calls.append(fn)
        return sized(fn, *a)
    return spy


def test_clipped_windows_keep_the_general_kernel(monkeypatch):
    """Ceil mode on an odd map: the last window runs past the input, so its count is not 4."""
    x = np.random.default_rng(3).standard_normal((1, 4, 7, 7)).astype(np.float32)
    ref = F.avg_pool2d(torch.from_numpy(x), 2, 2, ceil_mode=True).numpy()
    calls = []
    monkeypatch.setattr(pool, "sized", _spy(pool.sized, calls))
    k = pool.pooling(Node("AVEPOOL", ceil=True), [Val(x.shape)], [Val(ref.shape)], Settings(1))
    y = np.full(ref.shape, np.nan, np.float32)
    k.fn([x], [y])
    assert calls == [pool.pool_rows] and np.abs(y - ref).max() <= 1e-6 * np.abs(ref).max()
