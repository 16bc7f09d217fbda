"""`python -m embedlab.serving` as a child process for the tests that run the command itself."""
from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

from serving_export import MAX_BATCH


class ServeCommand:
    """The command in its own session, its stdout and stderr read line by line.

    `ports` are (HTTP, gRPC, metrics); 0 lets the command pick free ones. `extra` arguments go
    to the command unchanged.
    """

    def __init__(self, export, repo, env, ports=(0, 0, 0), *extra):
        http, grpc, metrics = ports
        cmd = [sys.executable, "-m", "embedlab.serving", "--export", str(export), "--repository", str(repo),
               "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics),
               "--max-batch-size", str(MAX_BATCH), *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     start_new_session=True)
        self.lines: list[str] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._q.put(line)
        self._q.put(None)

    def until(self, text: str, timeout: float = 180.0) -> str:
        """The output so far, once a line holding `text` is printed (AssertionError if not in time)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=0.5)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            if text in line:
                return "".join(self.lines)
        raise AssertionError(f"{text!r} not printed; output:\n{''.join(self.lines)}")

    def stop(self, expect_stopped_line: bool = False) -> int:
        """SIGTERM (SIGKILL to its session after 60 s); the exit status. With `expect_stopped_line`, a
        clean exit must also have printed that tritonserver stopped."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait()
        if expect_stopped_line and rc == 0:
            self.until("tritonserver stopped", timeout=5)
        return rc
