"""Run cases on a few worker processes; a worker that crashes or hangs is replaced and costs one case."""
from __future__ import annotations

import json
import os
import queue
import select
import subprocess
import sys
import threading
from pathlib import Path


class Worker:
    def __init__(self, mode: str, log: Path, env: dict | None = None):
        self.mode, self.log, self.env = mode, log, env
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "mnntool.conformance.worker", self.mode],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=open(self.log, "ab"), text=True, bufsize=1, env=self.env)

    def ask(self, request: dict, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return self._died()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return {"status": "fail", "stage": "timeout", "reason": f"no answer in {timeout:.0f} s"}
        line = self.proc.stdout.readline()
        if not line:
            return self._died()
        return json.loads(line)

    def _died(self) -> dict:
        code = self.proc.wait()
        self.proc = None
        why = f"signal {-code}" if code < 0 else f"exit {code}"
        return {"status": "fail", "stage": "crash", "reason": f"worker died ({why})"}

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def run_cases(mode: str, entries: list[dict], cases: Path, out: Path, workers: int = 2, timeout: float = 120.0,
              progress=None) -> dict[str, dict]:
    """{case name: result} for every entry, run by `workers` processes of `mode` (mnntool or mnn)."""
    out.mkdir(parents=True, exist_ok=True)
    todo: queue.Queue = queue.Queue()
    for e in entries:
        todo.put(e["name"])
    results: dict[str, dict] = {}
    lock = threading.Lock()
    env = dict(os.environ, OMP_NUM_THREADS="1", NUMBA_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    def loop(k: int):
        w = Worker(mode, out / f"worker_{mode}_{k}.log", env)
        try:
            while True:
                try:
                    name = todo.get_nowait()
                except queue.Empty:
                    return
                res = w.ask({"case": str(cases / name), "mnn": str(out / f"{name}.mnn")}, timeout)
                with lock:
                    results[name] = res
                    if progress:
                        progress()
        finally:
            w.stop()
    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
