"""mnntool: convert, optimize, quantize, verify and benchmark models in MNN's .mnn format.

Importing it changes no process settings; `mnntool.tuning.tune_process()` is the one call that does
(the CLI makes it).
"""

__version__ = "0.1.0"


def load(path, threads=None):
    """A runtime session: `mnntool.load("m.mnn").run({name: array}) -> {name: array}`."""
    from .api import load_session
    return load_session(path, threads)
