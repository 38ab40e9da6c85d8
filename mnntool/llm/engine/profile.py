"""Where a forward's time goes: per-step wall time and the parallel regions each step opened.

    m.prof = StepTimes()          # Model.forward and the layer step record into it while set
    m.forward(ids); print(m.prof.table())

Why: the engine's scaling with threads is decided by its serial parts (norms, RoPE, attention when it
runs on one thread, the activation, copies, Python between the kernels) and by what each parallel region
costs to open; timing the steps at 1 and N threads shows which. The hooks cost two clock reads per step.
"""
from __future__ import annotations

import time


class StepTimes:
    """Accumulated seconds, calls and parallel regions per step name."""

    def __init__(self):
        self.seconds: dict = {}
        self.calls: dict = {}
        self.regions: dict = {}
        self.forwards = 0

    def lap(self, name: str, t0: float, regions: int = 0) -> float:
        """Close step `name` begun at t0 (a perf_counter value); returns now, the next step's start."""
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + (now - t0)
        self.calls[name] = self.calls.get(name, 0) + 1
        self.regions[name] = self.regions.get(name, 0) + regions
        return now

    def reset(self) -> None:
        self.__init__()

    def as_dict(self, per: int = 1) -> dict:
        """{step: {"ms": per `per` forwards, "calls", "regions"}} plus totals."""
        per = max(per, 1)
        steps = {k: {"ms": 1e3 * v / per, "calls": self.calls[k] / per, "regions": self.regions[k] / per}
                 for k, v in sorted(self.seconds.items(), key=lambda kv: -kv[1])}
        return {"steps": steps, "total_ms": 1e3 * sum(self.seconds.values()) / per,
                "regions": sum(self.regions.values()) / per}

    def table(self, per: int = 1) -> str:
        d = self.as_dict(per)
        lines = [f"{'step':<12}{'ms':>10}{'share':>8}{'calls':>8}{'regions':>9}"]
        for k, v in d["steps"].items():
            share = v["ms"] / d["total_ms"] if d["total_ms"] else 0.0
            lines.append(f"{k:<12}{v['ms']:>10.3f}{100 * share:>7.1f}%{v['calls']:>8.1f}{v['regions']:>9.1f}")
        lines.append(f"{'total':<12}{d['total_ms']:>10.3f}{'':>8}{'':>8}{d['regions']:>9.1f}")
        return "\n".join(lines)
