"""Client side: request builders, a one-call `infer`, a bounded load generator, HPS statistics.

The load generator stands in for perf_analyzer (the `tritonclient` wheel does not ship it): a
fixed number of threads, each with its own synchronous client, send requests back to back for
a bounded time and count, on 127.0.0.1. Client threads share the machine (and Python's GIL)
with the server, so on a small machine the numbers are a lower bound of what the server does.
"""
from __future__ import annotations

import re
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np

__all__ = ["make_inputs", "infer", "predict", "Prediction", "run_load", "sweep", "LoadResult", "hps_stats",
           "client_for"]


def _module(protocol: str):
    if protocol == "http":
        import tritonclient.http as m
    elif protocol == "grpc":
        import tritonclient.grpc as m
    else:
        raise ValueError(f"protocol must be 'http' or 'grpc', got {protocol!r}")
    return m


def client_for(server_or_url, protocol: str = "http"):
    """A tritonclient InferenceServerClient for a `TritonServer` (or a "host:port" url)."""
    m = _module(protocol)
    url = server_or_url if isinstance(server_or_url, str) else (
        server_or_url.http_url if protocol == "http" else server_or_url.grpc_url)
    return m.InferenceServerClient(url)


def make_inputs(keys, protocol: str = "http", numkeys=None, keys_name: str = "EMB_KEY",
                numkeys_name: str | None = "EMB_N_KEY"):
    """tritonclient inputs for the ensemble: EMB_KEY (int64 [batch, k]) and EMB_N_KEY (int32 [batch, 1]).

    Args:
        keys: int64 array [batch, keys_per_sample] (sent as given: a wrong dtype reaches the server).
        numkeys: EMB_N_KEY to send; default: keys_per_sample for every sample.
        numkeys_name: None sends the keys only (the identity ensemble).
    """
    from tritonclient.utils import np_to_triton_dtype
    m = _module(protocol)
    keys = np.ascontiguousarray(keys)
    inputs = [m.InferInput(keys_name, list(keys.shape), np_to_triton_dtype(keys.dtype))]
    inputs[0].set_data_from_numpy(keys)
    if numkeys_name is not None:
        if numkeys is None:
            numkeys = np.full((keys.shape[0], 1), keys.shape[1] if keys.ndim == 2 else 0, np.int32)
        numkeys = np.ascontiguousarray(numkeys)
        n = m.InferInput(numkeys_name, list(numkeys.shape), np_to_triton_dtype(numkeys.dtype))
        n.set_data_from_numpy(numkeys)
        inputs.append(n)
    return inputs


def _protocol_of(client) -> str:
    return "grpc" if "grpc" in type(client).__module__ else "http"


def infer(client, keys, model: str = "ensemble", output: str = "DENSE_OUTPUT", protocol=None, **kw):
    """One request; returns the output array. `protocol` is taken from the client's module."""
    if protocol is None:
        protocol = _protocol_of(client)
    r = client.infer(model, make_inputs(keys, protocol, **kw))
    return r.as_numpy(output)


@dataclass
class Prediction:
    """The ensemble's answer to one request.

    `output` is DENSE_OUTPUT (float32 [batch, k]); `defaulted_keys` (int32 [batch]) counts, per
    sample, the keys that no tier of the HPS holds (found in neither the cache, the volatile nor
    the persistent database), whose embedding was the table's default vector: a sample with a
    count above 0 was scored on made-up inputs.
    """
    output: np.ndarray
    defaulted_keys: np.ndarray

    @property
    def total_defaulted(self) -> int:
        """Keys of the whole request answered with the default vector."""
        return int(self.defaulted_keys.sum())


def predict(client, keys, model: str = "ensemble", protocol=None, **kw) -> Prediction:
    """One request to the ensemble; returns its DENSE_OUTPUT with the count of defaulted keys per sample.

    Args:
        client: a tritonclient HTTP or gRPC `InferenceServerClient` (see `client_for`).
        keys: int64 [batch, keys_per_sample]; `kw` as for `make_inputs` (`numkeys`).

    Example (+SKIP: needs a running Triton server serving notebook 05's ensemble):
        >>> p = predict(client_for(server), np.array([[1, 10**15, 3]]))     # doctest: +SKIP
        >>> p.defaulted_keys                                               # doctest: +SKIP
        array([1], dtype=int32)
    """
    if protocol is None:
        protocol = _protocol_of(client)
    m = _module(protocol)
    outputs = [m.InferRequestedOutput("DENSE_OUTPUT"), m.InferRequestedOutput("DEFAULTED_KEYS")]
    r = client.infer(model, make_inputs(keys, protocol, **kw), outputs=outputs)
    defaulted = r.as_numpy("DEFAULTED_KEYS")
    if defaulted is None:
        raise RuntimeError(f"model {model!r} returned no DEFAULTED_KEYS: its repository was written by an "
                           "older embedlab; write it again with embedlab.serving.write_model_repository")
    return Prediction(output=r.as_numpy("DENSE_OUTPUT"), defaulted_keys=defaulted.reshape(-1))


@dataclass
class LoadResult:
    """What one load run measured. Latencies in seconds, per successful request."""
    model: str
    protocol: str
    batch: int
    concurrency: int
    seconds: float
    requests: int
    failed: int
    wrong: int
    latencies: np.ndarray = field(repr=False)
    errors: list = field(default_factory=list, repr=False)
    started: float = 0.0
    times: np.ndarray = field(default=None, repr=False)   # completion time of each request (s from start),
    # in completion order; latencies are in the same order

    @property
    def requests_per_s(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.requests_per_s * self.batch

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1e3) if self.latencies.size else float("nan")

    def summary(self) -> dict:
        return {"model": self.model, "protocol": self.protocol, "batch": self.batch,
                "concurrency": self.concurrency, "requests": self.requests, "failed": self.failed,
                "wrong": self.wrong, "seconds": round(self.seconds, 3),
                "requests_per_s": round(self.requests_per_s, 1), "rows_per_s": round(self.rows_per_s, 1),
                "p50_ms": round(self.percentile_ms(50), 3), "p90_ms": round(self.percentile_ms(90), 3),
                "p99_ms": round(self.percentile_ms(99), 3)}


def run_load(server_or_url, key_batches, *, model: str = "ensemble", output: str = "DENSE_OUTPUT",
             expected=None, atol: float = 1e-5, protocol: str = "http", concurrency: int = 1,
             duration_s: float = 2.0, max_requests: int | None = None, warmup: int = 2,
             numkeys_name: str | None = "EMB_N_KEY", on_progress=None) -> LoadResult:
    """Sends requests from `concurrency` threads until `duration_s` or `max_requests`.

    Args:
        key_batches: list of int64 [batch, k] arrays, all of one batch size; thread t sends
            batch (t + i * concurrency) % len at its i-th request.
        expected: optional list of expected outputs (same order); an answer further than
            `atol` from it counts as wrong.
        on_progress: optional callable(elapsed_s) called by thread 0 after each request (used
            to inject a fault part-way through a run).

    Returns:
        A `LoadResult`; failed requests keep their error messages in `.errors`.
    """
    if not key_batches:
        raise ValueError("key_batches is empty")
    batch = int(key_batches[0].shape[0])
    if any(int(k.shape[0]) != batch for k in key_batches):
        raise ValueError("all key_batches must have one batch size")
    if concurrency < 1 or duration_s <= 0:
        raise ValueError("concurrency must be >= 1 and duration_s > 0")
    lock = threading.Lock()
    lat, done_at, errors = [], [], []
    counts = {"sent": 0, "failed": 0, "wrong": 0}
    t0 = [0.0]
    # The barrier's action sets the start time before any thread is released.
    start_barrier = threading.Barrier(concurrency + 1,
                                      action=lambda: t0.__setitem__(0, time.perf_counter()))

    def worker(tid):
        client = client_for(server_or_url, protocol)
        try:
            # Warm-up requests are not counted (connection set-up, first batch of a size).
            for w in range(warmup):
                client.infer(model, make_inputs(key_batches[(tid + w) % len(key_batches)], protocol,
                                                numkeys_name=numkeys_name))
            start_barrier.wait()
            my_lat, my_done, i = [], [], 0
            deadline = t0[0] + duration_s
            while True:
                now = time.perf_counter()
                if now >= deadline:
                    break
                with lock:
                    if max_requests is not None and counts["sent"] >= max_requests:
                        break
                    counts["sent"] += 1
                j = (tid + i * concurrency) % len(key_batches)
                i += 1
                inputs = make_inputs(key_batches[j], protocol, numkeys_name=numkeys_name)
                t = time.perf_counter()
                try:
                    out = client.infer(model, inputs).as_numpy(output)
                except Exception as e:   # a failed request is counted and kept, not raised
                    with lock:
                        counts["failed"] += 1
                        if len(errors) < 20:
                            errors.append(str(e))
                    continue
                t1 = time.perf_counter()
                my_lat.append(t1 - t)
                my_done.append(t1 - t0[0])
                if expected is not None:
                    ok = out is not None and out.shape == np.shape(expected[j]) and \
                        np.allclose(out, expected[j], rtol=0, atol=atol)
                    if not ok:
                        with lock:
                            counts["wrong"] += 1
                            if len(errors) < 20:
                                err = "shape" if out is None or out.shape != np.shape(expected[j]) else \
                                    f"max abs diff {np.max(np.abs(out - expected[j])):.3g}"
                                errors.append(f"wrong answer for batch {j}: {err}")
                if on_progress is not None and tid == 0:
                    on_progress(t1 - t0[0])
            with lock:
                lat.extend(my_lat)
                done_at.extend(my_done)
        except threading.BrokenBarrierError:
            pass
        except Exception as e:
            with lock:
                errors.append(f"client thread {tid}: {e}")
            start_barrier.abort()
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(concurrency)]
    for th in threads:
        th.start()
    try:
        start_barrier.wait()
    except threading.BrokenBarrierError:
        for th in threads:
            th.join()
        raise RuntimeError("load generator could not start: " + "; ".join(errors))
    for th in threads:
        th.join()
    seconds = (max(done_at) if done_at else time.perf_counter() - t0[0])
    order = np.argsort(np.asarray(done_at))       # requests in completion order
    return LoadResult(model=model, protocol=protocol, batch=batch, concurrency=concurrency,
                      seconds=seconds, requests=len(lat), failed=counts["failed"], wrong=counts["wrong"],
                      latencies=np.asarray(lat)[order], errors=errors, started=t0[0],
                      times=np.asarray(done_at)[order])


_METRIC = re.compile(r'^embedlab_hps_stat\{([^}]*)\}\s+(\S+)$')


# Stats that are not added up over the instances of the hps_embedding model (each instance has
# its own ParameterServer): the same in every instance, a state, or a ratio recomputed below.
_SAME = (".rows", ".dim", ".default", ".cache_capacity")


def _combine(per_instance: dict) -> dict:
    out: dict = {}
    for stats in per_instance.values():
        for k, v in stats.items():
            if k not in out:
                out[k] = v
            elif k.endswith(".available"):
                out[k] = min(out[k], v)
            elif k.endswith(".down_seconds") or k.endswith(_SAME):
                out[k] = max(out[k], v)
            else:
                out[k] += v
    for k in [k for k in out if k.endswith(".latency_ms_mean")]:
        base = k[: -len("latency_ms_mean")]
        calls = out.get(base + "calls", 0.0)
        out[k] = 1e3 * out.get(base + "seconds", 0.0) / calls if calls else 0.0
    return out


def hps_stats(server_or_url, per_instance: bool = False) -> dict:
    """The HPS statistics the `hps_embedding` model publishes on the server's metrics endpoint.

    Returns {stat: value} with the flattened `ParameterServer.stats()` keys ("a.b.c"). On a server
    started by `TritonServer` they are the counters as they are when the scrape arrives: every
    request answered before it is counted (the metrics port has each `hps_embedding` instance
    publish before it answers). A tritonserver started otherwise publishes them every 0.25 s.

    Each model instance has its own ParameterServer and publishes under its own `instance`
    label; the counts are added up over the instances (`available` is the least, `down_seconds`
    the longest, `latency_ms_mean` recomputed from the sums). `per_instance=True` returns
    {instance: {stat: value}} instead.
    """
    url = server_or_url if isinstance(server_or_url, str) else server_or_url.metrics_url
    with urllib.request.urlopen(url, timeout=5.0) as r:
        text = r.read().decode()
    by_instance: dict = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(1)))
        by_instance.setdefault(labels.get("instance", ""), {})[labels.get("stat", "")] = float(m.group(2))
    return by_instance if per_instance else _combine(by_instance)


def sweep(server_or_url, make_batches, batch_sizes=(1, 32, 256, 1024), concurrencies=(1, 4), *,
          duration_s: float = 1.0, protocol: str = "http", model: str = "ensemble") -> list[dict]:
    """`run_load` over batch sizes x concurrencies; returns one `summary()` dict per point.

    Args:
        make_batches: callable(batch_size) -> list of int64 key arrays of that batch size.
    """
    out = []
    for b in batch_sizes:
        batches = make_batches(b)
        for c in concurrencies:
            r = run_load(server_or_url, batches, model=model, protocol=protocol, concurrency=c,
                         duration_s=duration_s)
            if r.failed:
                raise RuntimeError(f"{r.failed} requests failed at batch {b}, {c} clients: {r.errors[:3]}")
            out.append(r.summary())
    return out
