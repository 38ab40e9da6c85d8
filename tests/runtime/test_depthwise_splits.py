"""Work splits of the depthwise kernels, each parallel form against its serial twin bit for bit at 3 threads.

depthwise_lanes splits the blocks' output rows (block-major) into equal contiguous runs, one a chunk, any
number of chunks: a block cut between chunks loads only the input rows its rows' windows reach into that chunk's
scratch, which holds another block's rows from the call before (stale data must never reach a stored
pixel). Geometries: 3x3/5x5/7x7, stride 1 and 2, rows narrower than the 7-pixel tile, asymmetric pads, channel
counts off a multiple of 16. Against float64 NumPy to 2e-5 of the output's largest magnitude (fp32 sums of at
most 49 products)."""
import numpy as np
import pytest

from mnntool.runtime.kernels.micro import float_gemm as fg
from mnntool.runtime.kernels.micro.epilogue import NO_GRID

pytestmark = pytest.mark.skipif(not fg.HAS_AVX512, reason="AVX-512 kernels")


def _close(ref, got):
    assert np.abs(got - ref).max() <= 2e-5 * np.abs(ref).max()


def _reference(x, wt, b, k, s, pads, oh, ow):
    t, l, bo, r = pads
    xp = np.pad(x.astype(np.float64), ((0, 0), (t, max(bo, 0) + k), (l, max(r, 0) + k)))
    return sum(xp[:, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s] * wt[:, i * k + j, None, None]
               for i in range(k) for j in range(k)) + b[:, None, None]


@pytest.mark.parametrize("c, h, w, k, s, pads", [
    (40, 14, 14, 5, 1, (2, 2, 2, 2)), (33, 4, 6, 3, 2, (1, 1, 1, 1)), (20, 28, 27, 7, 2, (3, 3, 3, 3)),
    (17, 9, 13, 3, 1, (1, 1, 1, 1)), (72, 7, 7, 5, 1, (2, 2, 2, 2)), (24, 12, 11, 7, 2, (3, 2, 1, 0)),
    (16, 5, 5, 3, 1, (0, 0, 0, 0))])
def test_depthwise_lanes_split_by_rows(three_threads, c, h, w, k, s, pads):
    from mnntool.runtime.kernels.micro import depthwise_lanes as L
    t, l, bo, r = pads
    oh, ow = (h + t + bo - k) // s + 1, (w + l + r - k) // s + 1
    rng = np.random.default_rng(c * h + k)
    wt = (rng.standard_normal((c, k * k)) / k).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    wl, bt = L.lanes_weights(wt, k), L.lanes_bias(b)
    inpos, pw, nin, nout = L.tables(h, w, k, s, t, l, oh, ow)
    epf, grid = fg.epilogue_of(0, NO_GRID)
    xs = [rng.standard_normal((c, h, w)).astype(np.float32) for _ in range(2)]
    size = c * oh * ow

    def run(kernel, chunks, x, xt, yt):
        buf = np.full(size + 32, 7.0, np.float32)     # sentinels past the output
        out = buf[:size].reshape(c, oh, ow)
        out[:] = np.nan
        kernel(x, wl, bt, k, s, inpos, pw, epf, grid, xt, yt, out)
        assert (buf[size:] == 7.0).all()
        return out

    serial = L.depthwise_lanes.serial().dispatcher()
    want = [run(serial, 1, x, np.zeros((1, nin * 16), np.float32), np.zeros((1, nout * 16), np.float32)) for x in xs]
    for x, ref in zip(xs, want):
        _close(_reference(x, wt, b, k, s, pads, oh, ow), ref)
    par = L.depthwise_lanes.dispatcher()
    nb = -(-c // 16)
    for chunks in sorted({1, 2, 3, 4, 5, 7, nb + 1, min(nb * oh, 13)}):
        xt, yt = np.zeros((chunks, nin * 16), np.float32), np.zeros((chunks, nout * 16), np.float32)
        for x, ref in zip(xs, want):        # the second input on the scratch the first left
            got = run(par, chunks, x, xt, yt)
            assert np.array_equal(got.view(np.uint32), ref.view(np.uint32)), chunks


def test_lanes_chunks_one_a_thread():
    """Every thread gets a chunk while the blocks' rows last (32 channels on 28x28 at 4 threads: 4 chunks where
    whole blocks gave 2)."""
    from mnntool.runtime.kernels.micro.depthwise_lanes import chunks_of
    assert chunks_of(32, 28, 4) == 4 and chunks_of(72, 14, 16) == 16 and chunks_of(16, 1, 4) == 1
    assert chunks_of(1152, 7, 1) == 1 and chunks_of(16, 3, 8) == 3
