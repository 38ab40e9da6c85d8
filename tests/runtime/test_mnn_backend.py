"""`--backend mnn --threads 1` must time MNN on one core: the module loader's own thread count is not
honoured (MNN kept both cores busy at "1 thread"), so the session goes through a runtime manager.
Measured as CPU time over wall time of the process while MNN runs; no speed is asserted."""
import os
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto as TP, helper as h, numpy_helper as nh

from mnntool import api


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores to tell one thread from two")
def test_mnn_session_uses_one_core_at_one_thread(tmp_path):
    pytest.importorskip("MNN")
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(4):
        w = (rng.standard_normal((64, 64, 3, 3)) * 0.05).astype(np.float32)
        inits.append(nh.from_array(w, f"w{i}"))
        nodes.append(h.make_node("Conv", [prev, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        prev = f"c{i}"
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, 64, 56, 56])],
                         [h.make_tensor_value_info(prev, TP.FLOAT, [1, 64, 56, 56])], inits)
    import onnx
    src, dst = tmp_path / "m.onnx", tmp_path / "m.mnn"
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), src)
    api.convert(src, dst)
    # in a fresh process: thread pools other tests left in this one would count as CPU time
    code = f"""
import time, numpy as np
from mnntool.runtime.mnn_backend import MnnSession
sess = MnnSession({str(dst)!r}, ["x"], [{prev!r}], threads=1)
feeds = {{"x": np.random.default_rng(0).standard_normal((1, 64, 56, 56)).astype(np.float32)}}
for _ in range(3):
    sess.run(feeds)
wall, cpu = time.perf_counter(), time.process_time()
for _ in range(15):
    sess.run(feeds)
print((time.process_time() - cpu) / (time.perf_counter() - wall))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    ratio = float(done.stdout.strip().splitlines()[-1])
    assert ratio < 1.4, f"MNN used {ratio:.2f} cores at threads=1"
