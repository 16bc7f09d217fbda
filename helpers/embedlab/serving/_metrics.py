"""HPS statistics on Triton's metrics endpoint, current at every scrape.

A python-backend model can only push values into Triton's metrics (`pb_utils.Metric.set`, one
round trip to the server process per value; a lookup changes about 13
of them), and Triton has no hook that runs when `/metrics` is scraped. Publishing inside
`execute` would add those round trips to every request; publishing now and then leaves the
endpoint behind the counters. So the two ends meet here:

- in the `hps_embedding` model, a `StatsPublisher` thread owns the metrics: it publishes the
  `ParameterServer.stats()` entries that changed when asked through a Unix socket (one per
  model instance, in the folder named by the environment variable `EMBEDLAB_STATS_REFRESH_DIR`),
  and otherwise every `period_s` (so a server started without `TritonServer` lags by at most
  that);
- `TritonServer` serves the public metrics port itself (`MetricsFront`): each scrape first asks
  every instance to publish (`refresh_stats`) and waits for the answers, then relays Triton's
  own `/metrics`, so a scrape reads the counters as they are when it arrives.

NumPy and the standard library only: the publisher runs inside Triton's python stub.
"""
from __future__ import annotations

import http.server
import os
import select
import socket
import threading
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

__all__ = ["REFRESH_DIR_ENV", "flatten_stats", "StatsPublisher", "refresh_stats", "MetricsFront"]

REFRESH_DIR_ENV = "EMBEDLAB_STATS_REFRESH_DIR"
_REQUEST = b"refresh\n"


def _read_line(sock, limit: int) -> bytes:
    """Reads from sock until a newline, `limit` bytes, or the peer's end of stream (then what
    came, without its newline)."""
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = sock.recv(limit)
        if not chunk:
            break
        data += chunk
    return data


def flatten_stats(value, prefix: str = "", out: dict | None = None) -> dict:
    """{"a.b.c": float} for the numbers (and booleans) of a nested stats dict; strings are left out."""
    if out is None:
        out = {}
    if isinstance(value, dict):
        for k, v in value.items():
            flatten_stats(v, f"{prefix}.{k}" if prefix else str(k), out)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            flatten_stats(v, f"{prefix}.{i}", out)
    elif isinstance(value, (bool, int, float, np.integer, np.floating)):
        out[prefix] = float(value)
    return out


class StatsPublisher:
    """Publishes `stats()` into metrics from one thread: on request (Unix socket) and every `period_s`.

    Args:
        stats: callable returning the nested stats dict (`ParameterServer.stats`).
        make_metric: callable(stat_name) -> an object with `.set(float)` (a `pb_utils.Metric`).
        refresh_dir: folder for this instance's socket (`<pid>.sock`); None: periodic only.
        period_s: the longest a changed value waits when nobody asks.
    """

    def __init__(self, stats, make_metric, refresh_dir=None, period_s: float = 0.25):
        self._stats, self._make_metric = stats, make_metric
        self.period_s = float(period_s)
        self._metrics: dict = {}
        self._published: dict = {}
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()     # close() wakes the thread's select
        self._listener = None
        self.socket_path = None
        self.error = None           # why the socket could not be set up (then periodic only)
        if refresh_dir:
            path = Path(refresh_dir) / f"{os.getpid()}.sock"
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    s.bind(str(path))
                    s.listen(8)
                except OSError:
                    s.close()
                    raise
                self._listener, self.socket_path = s, path
            except OSError as e:
                self.error = f"cannot listen on {path}: {e}"
        self.publish()              # every stat exists from the start (value 0 where nothing happened)
        self._thread = threading.Thread(target=self._run, name="embedlab-stats-publisher", daemon=True)
        self._thread.start()

    def publish(self) -> int:
        """Sets the metrics whose value changed since the last publish; returns how many."""
        flat = flatten_stats(self._stats())
        n = 0
        for key, value in flat.items():
            if self._published.get(key) == value:
                continue
            m = self._metrics.get(key)
            if m is None:
                m = self._metrics[key] = self._make_metric(key)
            m.set(value)
            self._published[key] = value
            n += 1
        return n

    def _answer(self, conn) -> None:
        with conn:
            conn.settimeout(2.0)
            data = _read_line(conn, 64)
            if not data.endswith(b"\n") and len(data) < 64:
                return                      # the asker went away before a whole request
            if data != _REQUEST:
                conn.sendall(b"error: unknown request\n")
                return
            try:
                n = self.publish()
            except Exception as e:          # reported to the asker; the thread goes on
                conn.sendall(f"error: {type(e).__name__}: {e}\n".encode())
                return
            conn.sendall(f"ok {n}\n".encode())

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                watch = [self._wake_r] + ([self._listener] if self._listener is not None else [])
                ready, _, _ = select.select(watch, [], [], self.period_s)
                if self._stop.is_set():
                    return
                if self._listener in ready:
                    conn, _ = self._listener.accept()
                    self._answer(conn)
                else:
                    self.publish()
            except (OSError, ValueError):
                if self._stop.is_set():
                    return
                # A client that went away mid-answer; the next request or tick goes on.
            except Exception:
                if self._stop.is_set():
                    return
                self._stop.wait(self.period_s)   # stats() failed (closing): try again later

    def close(self) -> None:
        """Stops the thread and removes the socket (idempotent)."""
        self._stop.set()
        if self._wake_w is not None:
            try:
                self._wake_w.send(b"x")
            except OSError:
                pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        for s in (self._wake_r, self._wake_w):
            if s is not None:
                s.close()
        self._wake_r = self._wake_w = None
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self.socket_path is not None:
            try:
                self.socket_path.unlink()
            except OSError:
                pass
            self.socket_path = None
        self._metrics.clear()


def refresh_stats(refresh_dir, timeout_s: float = 5.0) -> list[str]:
    """Asks every publisher listening in `refresh_dir` to publish now, and waits for each.

    Returns the problems (one line per instance that did not answer "ok"); a socket nobody
    listens on any more (an instance that was unloaded) is removed.
    """
    problems = []
    for path in sorted(Path(refresh_dir).glob("*.sock")):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            s.connect(str(path))
            s.sendall(_REQUEST)
            reply = _read_line(s, 4096)
            if not reply.startswith(b"ok "):
                problems.append(f"{path.name}: {reply.decode(errors='replace').strip() or 'no answer'}")
        except (ConnectionRefusedError, FileNotFoundError):
            try:
                path.unlink()
            except OSError:
                pass
        except OSError as e:
            problems.append(f"{path.name}: {type(e).__name__}: {e}")
        finally:
            s.close()
    return problems


class MetricsFront:
    """The public metrics endpoint: refresh the HPS statistics, then relay Triton's `/metrics`.

    Args:
        host, port: where to listen (port 0: a free one; `.port` tells which).
        upstream: Triton's own metrics URL ("http://127.0.0.1:<port>/metrics").
        refresh_dir: the folder of the publishers' sockets.
        extra: optional callable returning more metrics text (Prometheus format) appended to
            each answer (`TritonServer`'s restart count).
    """

    def __init__(self, host: str, port: int, upstream: str, refresh_dir, extra=None):
        self.upstream = upstream
        self.extra = extra
        self.refresh_dir = Path(refresh_dir)
        self.last_problems: list[str] = []
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):   # noqa: N802 (http.server's name)
                if self.path.split("?")[0] != "/metrics":
                    self._reply(404, b"only /metrics is served here\n", "text/plain")
                    return
                front.last_problems = refresh_stats(front.refresh_dir)
                try:
                    with urllib.request.urlopen(front.upstream, timeout=10.0) as r:
                        body, status = r.read(), r.status
                        ctype = r.headers.get("Content-Type", "text/plain; version=0.0.4")
                except urllib.error.HTTPError as e:
                    body, status, ctype = e.read(), e.code, "text/plain"
                except (urllib.error.URLError, OSError) as e:
                    self._reply(502, f"tritonserver's metrics endpoint did not answer: {e}\n".encode(),
                                "text/plain")
                    return
                if front.extra is not None and status == 200:
                    body = body + (b"" if body.endswith(b"\n") or not body else b"\n") + front.extra().encode()
                self._reply(status, body, ctype)

            def _reply(self, status, body, ctype):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):   # no line per scrape on stderr
                pass

        self._httpd = http.server.ThreadingHTTPServer((host, int(port)), Handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="embedlab-metrics-front", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stops listening (idempotent)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join(timeout=5.0)
            self._httpd = None
