"""mnntool: convert, optimize, quantize, verify and benchmark models in MNN's .mnn format."""

__version__ = "0.1.0"


def load(path, threads=None):
    """A runtime session: `mnntool.load("m.mnn").run({name: array}) -> {name: array}`."""
    from .runtime.session import load as _load
    return _load(path, threads)
