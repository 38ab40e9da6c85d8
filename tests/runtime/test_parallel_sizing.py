"""Small kernels run their serial twin when several threads are set, tiny ones at one thread too; the
twin computes the same thing (reference: numpy)."""
import numpy as np

from mnntool.runtime.kernels import PARALLEL_MIN_WORK, SERIAL_AT_ONE_MAX_WORK, serial, sized
from mnntool.runtime.kernels.micro.conv_loops import bias_act
from mnntool.runtime.kernels.micro.epilogue import NO_GRID, RELU6


def test_serial_twin_matches_numpy_and_sizing_picks_it():
    twin = serial(bias_act)
    assert twin is serial(bias_act) and twin is not bias_act
    assert not twin.targetoptions.get("parallel")
    assert sized(bias_act, 10, 2).kernel is twin
    assert sized(bias_act, PARALLEL_MIN_WORK, 2) is bias_act.dispatcher()
    assert sized(bias_act, 10, 1).kernel is twin           # one thread, tiny work: no OpenMP region to enter
    assert sized(bias_act, SERIAL_AT_ONE_MAX_WORK, 1).kernel is bias_act   # the parallel kernel wakes no one
    rng = np.random.default_rng(0)
    y = rng.standard_normal((6, 50)).astype(np.float32) * 5
    b = rng.standard_normal(6).astype(np.float32)
    ref = np.clip(y + b[:, None], 0, 6)
    twin(y, b, RELU6, NO_GRID)
    np.testing.assert_allclose(y, ref, rtol=0, atol=1e-6)
