"""Fixtures the runtime's tests share."""
import pytest


@pytest.fixture
def three_threads():
    """Numba's thread count at 3 (or what the process has) for the test, restored after: parallel kernels split
    their work across threads against their serial twins."""
    import numba
    before = numba.get_num_threads()
    numba.set_num_threads(min(3, numba.config.NUMBA_NUM_THREADS))
    yield
    numba.set_num_threads(before)
