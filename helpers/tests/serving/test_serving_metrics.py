"""The pieces that keep the metrics endpoint current, without a server: the publisher a model
instance runs (publish on request through its socket, and on a timer), the refresh a scrape
sends, and the front that relays Triton's metrics after the refresh."""
from __future__ import annotations

import http.server
import threading
import time
import urllib.error
import urllib.request

import pytest

from embedlab.serving._metrics import MetricsFront, StatsPublisher, flatten_stats, refresh_stats


class _Metric:
    def __init__(self, log, name):
        self.log, self.name, self.value = log, name, None

    def set(self, v):
        self.value = v
        self.log.append((self.name, v))


def _publisher(tmp_path, stats, period_s=60.0):
    log, made = [], {}

    def make(name):
        made[name] = _Metric(log, name)
        return made[name]
    return StatsPublisher(lambda: stats, make, refresh_dir=tmp_path, period_s=period_s), log, made


def test_flatten_keeps_numbers_only():
    flat = flatten_stats({"a": {"b": 1, "c": True, "d": "text", "e": None}, "f": [2.5, {"g": 3}]})
    assert flat == {"a.b": 1.0, "a.c": 1.0, "f.0": 2.5, "f.1.g": 3.0}


def test_publish_on_request_only_what_changed(tmp_path):
    stats = {"t": {"lookups": 0, "keys": 0}, "ok": True}
    pub, log, made = _publisher(tmp_path, stats)
    try:
        assert {n: m.value for n, m in made.items()} == {"t.lookups": 0.0, "t.keys": 0.0, "ok": 1.0}
        log.clear()
        stats["t"]["lookups"] = 10
        stats["t"]["keys"] = 30
        assert made["t.lookups"].value == 0.0          # nothing is pushed until asked (period 60 s)
        assert refresh_stats(tmp_path) == []            # what a scrape does: ask, and wait for "ok"
        assert made["t.lookups"].value == 10.0 and made["t.keys"].value == 30.0
        assert sorted(log) == [("t.keys", 30.0), ("t.lookups", 10.0)]
        log.clear()
        assert refresh_stats(tmp_path) == [] and log == []   # unchanged values are not sent again
    finally:
        pub.close()
    assert not list(tmp_path.glob("*.sock"))


def test_publish_on_the_timer_without_requests(tmp_path):
    stats = {"n": 0}
    pub, _, made = _publisher(tmp_path, stats, period_s=0.05)
    try:
        stats["n"] = 7
        deadline = time.monotonic() + 5.0
        while made["n"].value != 7.0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert made["n"].value == 7.0
    finally:
        pub.close()


def test_refresh_reports_failures_and_drops_stale_sockets(tmp_path):
    import socket
    stale = tmp_path / "999999.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()                                           # bound, nobody listens: an unloaded instance
    calls = {"n": 0}

    def stats():
        calls["n"] += 1
        if calls["n"] > 1:
            raise RuntimeError("HPS: the ParameterServer is closed")
        return {"n": 1}
    pub = StatsPublisher(stats, lambda name: _Metric([], name), refresh_dir=tmp_path, period_s=60.0)
    try:
        problems = refresh_stats(tmp_path)
        assert len(problems) == 1 and "RuntimeError: HPS: the ParameterServer is closed" in problems[0]
        assert not stale.exists()
    finally:
        pub.close()


def test_front_refreshes_then_relays(tmp_path):
    stats = {"lookups": 0}
    published = {}

    class M:
        def __init__(self, name):
            self.name = name

        def set(self, v):
            published[self.name] = v

    class Upstream(http.server.BaseHTTPRequestHandler):
        def do_GET(self):   # noqa: N802
            body = f'embedlab_hps_stat{{stat="lookups"}} {published.get("lookups", -1)}\n'.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass
    up = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    pub = StatsPublisher(lambda: stats, M, refresh_dir=tmp_path, period_s=60.0)
    front = MetricsFront("127.0.0.1", 0, f"http://127.0.0.1:{up.server_address[1]}/metrics", tmp_path)
    try:
        url = f"http://127.0.0.1:{front.port}/metrics"
        for n in (10, 11, 25):
            stats["lookups"] = n
            with urllib.request.urlopen(url, timeout=5) as r:
                assert r.read().decode() == f'embedlab_hps_stat{{stat="lookups"}} {float(n)}\n'
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{front.port}/other", timeout=5)
        assert e.value.code == 404
    finally:
        front.close()
        pub.close()
        up.shutdown()
        up.server_close()
