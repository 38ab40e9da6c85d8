"""What a run does, step by step: (kernel, input slots, output views or None, output slots, the argument
list where every input sits in a fixed slot, else None), and nothing else. Steps with nothing to do at
run time (an elided Concat, a view bound at prepare) are left out."""
from __future__ import annotations

from . import reuse
from .kernels import kernel_for
from .state import Planning

OPTIONAL = False


def run(p: Planning) -> None:
    absent = len(p.names)
    for s in p.steps:
        if (s.kernel.writes_out and s.elided) or s.bound:
            continue
        ins = tuple(i if i >= 0 else absent for i in s.ins)
        # a step whose inputs all sit in fixed slots gets its argument list once, not every run
        # (~0.3 us a step: a tiny transformer's 30 steps of 1-3 us)
        bound = [p.slots[i] for i in ins] if all(i in p.fixed for i in ins) else None
        if s.shared is not None:     # a kernel the plans of its arena share (reuse.py)
            node, k_ins, k_outs, _ = s.source
            reuse.check(s, bound, s.out_views if s.kernel.writes_out else None,
                        lambda: kernel_for(node, k_ins, k_outs, p.settings))
        p.calls.append((s.kernel.fn, ins, s.out_views if s.kernel.writes_out else None, s.outs, bound))
        p.ran.append(s)
