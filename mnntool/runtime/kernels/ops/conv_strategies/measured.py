"""A layer's strategy chosen by timing on this host, among strategies that give the same bits.

The order of STRATEGIES and the thresholds in dense.py were measured on an AMD EPYC; on a 16-core Intel Xeon
the same layers rank differently (ResNet-50's strided 3x3 convolutions 1.5x onnxruntime's time there, 1.06x
on the EPYC). MNN picks among its executions at run time; here the dense strategies whose micro-kernel
sums every output in the same order (the 48-pixel tile over the taps, one FMA a tap, K blocks carried
through the output exactly: SAME_BITS) compete on the layer's first calls, and the faster is kept. Their
outputs are identical, so the choice changes the time, never the answer (tests/runtime/test_measured_strategy.py
checks the bits).

The choice is kept per geometry and thread count in this process, and in `strategy_choices.json` beside
the kernel library (as host_tuning.json), so a later session on this host builds the winner alone. Layers
under MIN_FLOPS keep the rule's pick (a second build and a few slower calls would cost more than a wrong
pick). Off with step timing (MNNTOOL_STEP_TIMING=off, MNNTOOL_HOST_TUNING=defaults: the test suite's
plans do not depend on how loaded the machine is) or MNNTOOL_MEASURE_STRATEGIES=off.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import astuple

from ... import Kernel, writes

SAME_BITS = ("im2col-in-place", "im2col-wide", "im2col-implicit")
MIN_FLOPS = 20_000_000
SAMPLES = 2         # timed calls of each candidate (after one untimed call of each)
MARGIN = 0.97       # the other candidate must take at most this share of the rule's pick's best time

_lock = threading.Lock()
_known: dict[str, str] = {}     # "threads|geometry" -> strategy name: this process's choices
_loaded = [False]


def enabled() -> bool:
    from ... import step_timing
    if os.environ.get("MNNTOOL_MEASURE_STRATEGIES", "on").strip().lower() in ("off", "0", "no", "false"):
        return False
    return step_timing.enabled()


def key_of(g, threads: int) -> str:
    return f"{threads}|" + ",".join(str(v) for v in astuple(g))


def _path():
    from ...compile.aot import cache_dir
    return cache_dir() / "strategy_choices.json"


def _host() -> str:
    from ....host_tuning import _host_key
    return _host_key()


def _load() -> None:
    if _loaded[0]:
        return
    _loaded[0] = True
    try:
        _known.update(json.loads(_path().read_text()).get(_host(), {}))
    except (OSError, ValueError, AttributeError):
        pass


def _record(key: str, name: str) -> None:
    """Keeps the choice for this process, and on disk unless the host is busy (figures then say more about
    the neighbours than the host): the file whole, a temporary then a rename."""
    from ....host_tuning import _busy
    with _lock:
        _known[key] = name
        if _busy():
            return
        path = _path()
        try:
            data = json.loads(path.read_text()) if path.exists() else {}
        except (OSError, ValueError):
            data = {}
        data.setdefault(_host(), {})[key] = name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
            os.replace(tmp, path)
        except OSError:
            pass


def candidates(g, suited: list) -> list:
    """The rule's pick and the next suiting strategy of its SAME_BITS family: [] when the pick is outside it
    or has no rival."""
    if not suited or suited[0].name not in SAME_BITS:
        return []
    rivals = [s for s in suited[1:] if s.name in SAME_BITS and s.name != suited[0].name]
    return [suited[0], rivals[0]] if rivals else []


class Chooser:
    """Runs kernels a (the rule's pick) and b in turns, one untimed call each, then SAMPLES timed calls each,
    and keeps b where its best time is at most MARGIN x a's; `chosen(name)` is told the winner."""

    __slots__ = ("fns", "names", "calls", "best", "count", "kept", "on_choice")

    def __init__(self, a: Kernel, b: Kernel, names: tuple, on_choice):
        self.fns, self.names, self.on_choice = (a.fn, b.fn), names, on_choice
        self.calls, self.best, self.count, self.kept = 0, [float("inf")] * 2, [0, 0], None

    def __call__(self, inputs, outputs):
        kept = self.kept
        if kept is not None:
            return kept(inputs, outputs)
        n = self.calls
        self.calls = n + 1
        form = n & 1
        if n < 2:
            return self.fns[form](inputs, outputs)
        t = time.perf_counter()
        self.fns[form](inputs, outputs)
        dt = time.perf_counter() - t
        self.best[form] = min(self.best[form], dt)
        self.count[form] += 1
        if min(self.count) >= SAMPLES:
            pick = 1 if self.best[1] <= MARGIN * self.best[0] else 0
            self.kept = self.fns[pick]
            self.on_choice(self.names[pick])


def build(g, layer, suited: list, flops: float):
    """The kernel of a layer whose pick has a same-bits rival: the recorded winner's, or a Chooser of the two;
    None where the rule's pick stands (no rival, a small layer, measuring off)."""
    pair = candidates(g, suited)
    if not pair or flops < MIN_FLOPS or not enabled():
        return None
    key = key_of(g, layer.threads)
    _load()
    known = _known.get(key)
    if known is not None:
        chosen = next((s for s in pair if s.name == known), None)
        return chosen.build(g, layer) if chosen is not None else None
    a, b = (s.build(g, layer) for s in pair)
    if not (a.writes_out and b.writes_out) or a.out_grid != b.out_grid:
        return a
    return writes(Chooser(a, b, (pair[0].name, pair[1].name), lambda name: _record(key, name)))
