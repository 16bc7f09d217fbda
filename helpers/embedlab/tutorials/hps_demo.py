"""The HPS tiers at work (notebook 05, part 7; notebook 06 uses `captured_log`).

* :func:`hit_rate_vs_cache_size`: cache hit rate against cache size on a Zipf stream, next to a
  frequency oracle (:func:`top_k_hit_rate`).
* :func:`tier_stacks`: one stream through cache -> hash_map, cache -> Redis -> RocksDB and RocksDB
  alone, every lookup timed (wall and CPU time), split by tier and checked against the sparse files.
* :func:`redis_outage`: the same stream through cache -> Redis -> RocksDB while Redis is killed
  and later restarted empty, with the time per phase.
* :func:`slow_lookups` and :func:`tier_split` turn those measurements into the notebook's
  explanations (where a slow lookup spent its time; which tier costs what).

The server's log messages during a run are kept in ``StreamRun.log`` (and not printed), so a
notebook shows them as part of the result. No TensorFlow here.
"""
from __future__ import annotations

import contextlib
import logging
import resource
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..sparse_model import read_sparse_model
from ..hps.server import ParameterServer

log = logging.getLogger("embedlab.hps")

__all__ = ["zipf_stream", "hit_rate_vs_cache_size", "top_k_hit_rate", "StreamRun", "run_stream",
           "tier_stacks", "redis_outage", "slow_lookups", "tier_split", "captured_log", "TIERS"]

TIERS = ("cache", "volatile", "persistent")
_RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)   # the calling thread (Linux)


def zipf_stream(keys: np.ndarray, n_batches: int, batch: int, alpha: float = 1.05, seed: int = 0) -> list:
    """``n_batches`` batches of ``batch`` keys drawn from ``keys`` with Zipf(alpha) popularity
    (a random key order decides which keys are popular)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(keys))
    ranks = np.arange(1, len(keys) + 1, dtype=np.float64)
    p = ranks ** -alpha
    p /= p.sum()
    return [keys[order[rng.choice(len(keys), size=batch, p=p)]] for _ in range(n_batches)]


def _model(name, sparse_dir, dim, **kw):
    m = {"model": name, "sparse_files": [str(Path(sparse_dir).resolve())], "embedding_vecsize_per_table": [dim],
         "embedding_table_names": ["t"], "default_value_for_each_table": [0.0]}
    m.update(kw)
    return m


def hit_rate_vs_cache_size(sparse_dir, stream, fractions=(0.01, 0.02, 0.05, 0.1, 0.2, 0.5),
                           warmup_batches: int = 5) -> dict:
    """Cache hit rate over the stream (after ``warmup_batches``) for each ``gpucacheper`` in
    ``fractions``; the volatile tier is a ``hash_map`` holding every row, insertions synchronous.

    Returns:
        ``{"fraction": [...], "hit_rate": [...], "capacity": [...]}``.
    """
    sm = read_sparse_model(sparse_dir)
    out = {"fraction": [], "hit_rate": [], "capacity": []}
    for f in fractions:
        cfg = {"volatile_db": {"type": "hash_map"}, "persistent_db": {"type": "disabled"},
               "models": [_model("zipf", sparse_dir, sm.dim, gpucache=True, gpucacheper=float(f),
                                 hit_rate_threshold=1.5)]}
        with ParameterServer(cfg) as ps:
            for b in stream[:warmup_batches]:
                ps.lookup("zipf", 0, b)
            s0 = ps.stats()["tiers"]["cache"]
            for b in stream[warmup_batches:]:
                ps.lookup("zipf", 0, b)
            s1 = ps.stats()["tiers"]["cache"]
            hits, misses = s1["hits"] - s0["hits"], s1["misses"] - s0["misses"]
            out["fraction"].append(float(f))
            out["hit_rate"].append(hits / max(1, hits + misses))
            out["capacity"].append(ps.table_info("zipf", 0)["cache_capacity"])
    return out


def top_k_hit_rate(stream, capacities, warmup_batches: int = 5) -> list:
    """The hit rate a cache of each capacity would reach if it held the stream's most frequent
    keys from the start (a frequency oracle no online cache can beat on an i.i.d. stream)."""
    keys = np.concatenate(stream[warmup_batches:])
    _, counts = np.unique(keys, return_counts=True)
    cum = np.concatenate([[0], np.cumsum(np.sort(counts)[::-1])]) / len(keys)
    return [float(cum[min(int(c), len(cum) - 1)]) for c in capacities]


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(f"{record.levelname}: {record.getMessage()}")


@contextlib.contextmanager
def captured_log(name: str = "embedlab.hps"):
    """Collects the messages of logger ``name`` (INFO and above) in a list instead of printing them.

    Example:
        >>> with captured_log() as messages:
        ...     logging.getLogger("embedlab.hps").warning("Redis down")
        >>> messages
        ['WARNING: Redis down']
    """
    logger = logging.getLogger(name)
    handler = _Collect()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


@dataclass
class StreamRun:
    """One stream through one tier stack, per lookup.

    ``latency_ms``: wall time; ``cpu_ms``: CPU time of this process over the lookup (every
    thread); ``preempted``: involuntary context switches of the calling thread during it (it
    was ready to run and another thread or process took the core); ``tier_ms`` / ``tier_keys`` / ``tier_inserted``: per tier
    (``cache``, ``volatile``, ``persistent``), the time its finds took, the keys it was asked
    for and the rows written into it; ``exact``: the answer equals the sparse files' rows;
    ``events``: batch index -> what happened before it; ``log``: the server's log messages.
    """
    name: str
    latency_ms: list = field(default_factory=list)
    cpu_ms: list = field(default_factory=list)
    preempted: list = field(default_factory=list)
    tier_ms: dict = field(default_factory=lambda: {t: [] for t in TIERS})
    tier_keys: dict = field(default_factory=lambda: {t: [] for t in TIERS})
    tier_inserted: dict = field(default_factory=lambda: {t: [] for t in TIERS})
    exact: list = field(default_factory=list)
    events: dict = field(default_factory=dict)
    stats: dict = field(default_factory=dict)
    log: list = field(default_factory=list)

    def phases(self) -> list:
        """``[(label, first, stop)]`` batch ranges split at the events (the first is "start")."""
        cuts = sorted(self.events)
        starts = [0] + cuts
        labels = ["start"] + [self.events[c] for c in cuts]
        stops = cuts + [len(self.latency_ms)]
        return [(lab, a, b) for lab, a, b in zip(labels, starts, stops) if b > a]


class _Recorder:
    """Times lookups of one server into a :class:`StreamRun` and checks them against the files."""

    def __init__(self, name, ps: ParameterServer, model, oracle_vectors, key_to_row):
        self.run = StreamRun(name)
        self.ps, self.model, self.vectors, self.key_to_row = ps, model, oracle_vectors, key_to_row
        self.prev = ps.stats()["tiers"]

    def lookup(self, b) -> None:
        run = self.run
        r0 = resource.getrusage(_RUSAGE_THREAD).ru_nivcsw
        c0, t0 = time.process_time(), time.perf_counter()
        got = self.ps.lookup(self.model, 0, b)
        t1, c1 = time.perf_counter(), time.process_time()
        r1 = resource.getrusage(_RUSAGE_THREAD).ru_nivcsw
        run.latency_ms.append(1e3 * (t1 - t0))
        run.cpu_ms.append(1e3 * (c1 - c0))
        run.preempted.append(r1 - r0)
        run.exact.append(bool(np.array_equal(got, self.vectors[self.key_to_row(b)])))
        now = self.ps.stats()["tiers"]
        prev = self.prev
        for t in TIERS:
            run.tier_ms[t].append(1e3 * (now[t]["seconds"] - prev[t]["seconds"]))
            run.tier_keys[t].append(now[t]["hits"] + now[t]["misses"] - prev[t]["hits"] - prev[t]["misses"])
            run.tier_inserted[t].append(now[t]["inserted"] - prev[t]["inserted"])
        self.prev = now

    def finish(self, messages) -> StreamRun:
        self.run.stats = self.ps.stats()
        self.run.log = list(messages)
        return self.run


def run_stream(name: str, ps: ParameterServer, model: str, stream, oracle_vectors, key_to_row,
               on_batch=None) -> StreamRun:
    """Looks every batch up, timing it (wall, CPU, per tier) and comparing it with the sparse
    file's rows. ``on_batch(i)`` runs before batch ``i`` and may return an event label."""
    with captured_log() as messages:
        rec = _Recorder(name, ps, model, oracle_vectors, key_to_row)
        for i, b in enumerate(stream):
            if on_batch is not None:
                ev = on_batch(i)
                if ev:
                    rec.run.events[i] = ev
            rec.lookup(b)
        return rec.finish(messages)


def _oracle(sparse_dir):
    sm = read_sparse_model(sparse_dir)
    order = np.argsort(sm.keys)
    sorted_keys = sm.keys[order]

    def key_to_row(b):
        return order[np.searchsorted(sorted_keys, b)]
    return sm, key_to_row


def _drop_redis_table(volatile_db: dict, table: str) -> None:
    """Deletes the demo's table from a Redis it wrote to (a user's Redis keeps no demo rows)."""
    from ..hps.config import load_config
    from ..hps.tiers import RedisTier
    cfg = load_config({"volatile_db": volatile_db, "persistent_db": {"type": "disabled"},
                       "models": [_model("x", "/nonexistent", 1)]}).volatile_db
    tier = RedisTier(cfg)
    try:
        tier.drop(table)
    finally:
        tier.close()


def tier_stacks(sparse_dir, stream, redis, workdir=None, gpucacheper: float = 0.05,
                use_native: bool = True) -> list:
    """The same stream through three stacks, no fault: cache -> ``hash_map``; cache -> Redis ->
    RocksDB; RocksDB alone.

    The three servers are open together and each batch is looked up in every stack in turn, so a
    slow moment of the machine (another process on the cores) falls on all stacks alike.

    Args:
        redis: the Redis of the second stack (:func:`embedlab.services.redis_server.hps_redis`: the user's,
            named by ``EMBEDLAB_REDIS_ADDRESS``, or a local one). The demo's table
            (``hps_et.walk.t``) is deleted from it afterwards.
        use_native: False leaves out the compiled cache and hash map (builds without them).

    Returns:
        A list of :class:`StreamRun`, in that order.
    """
    sm, key_to_row = _oracle(sparse_dir)
    work = Path(workdir or tempfile.mkdtemp(prefix="embedlab-hps-stacks-"))
    work.mkdir(parents=True, exist_ok=True)
    cache = dict(gpucache=use_native, gpucacheper=gpucacheper)
    vdb = redis.volatile_db(num_partitions=8, initial_cache_rate=1.0, cache_missed_embeddings=True)
    configs = []
    if use_native:
        configs.append(("cache -> hash_map", {"volatile_db": {"type": "hash_map"}, "persistent_db": {"type": "disabled"},
                                              "models": [_model("walk", sparse_dir, sm.dim, **cache)]}))
    configs.append(("cache -> Redis -> RocksDB" if use_native else "Redis -> RocksDB",
                    {"volatile_db": vdb, "persistent_db": {"type": "rocks_db", "path": str(work / "rocksdb_redis")},
                     "models": [_model("walk", sparse_dir, sm.dim, **cache)]}))
    configs.append(("RocksDB only", {"volatile_db": {"type": "disabled"},
                                     "persistent_db": {"type": "rocks_db", "path": str(work / "rocksdb_only")},
                                     "models": [_model("walk", sparse_dir, sm.dim, gpucache=False)]}))
    with contextlib.ExitStack() as stack:
        stack.callback(_drop_redis_table, vdb, "hps_et.walk.t")
        messages = stack.enter_context(captured_log())
        recorders = [_Recorder(name, stack.enter_context(ParameterServer(cfg)), "walk", sm.vectors, key_to_row)
                     for name, cfg in configs]
        for b in stream:
            for rec in recorders:
                rec.lookup(b)
        return [rec.finish(messages) for rec in recorders]


def redis_outage(sparse_dir, stream, redis, workdir=None, gpucacheper: float = 0.05, kill_at: float = 0.5,
                 restart_at: float | None = 0.8, use_native: bool = True) -> StreamRun:
    """The stream through cache -> Redis -> RocksDB; Redis is killed (SIGKILL) before batch
    ``kill_at * len(stream)`` and started again, empty, before ``restart_at * len(stream)``.

    Args:
        redis: a Redis started by this process (:func:`embedlab.services.redis_server.redis_to_kill` gives
            one): a server this process did not start is never killed (ValueError).

    ``retry_seconds=0``: every lookup tries Redis again while it is down (a refused connection
    costs well under a millisecond here), so the first lookup after the restart finds it back,
    however fast the batches go. A server would wait longer between tries.
    """
    if getattr(redis, "external", True):
        raise ValueError(f"redis_outage kills its Redis, and {redis!r} was not started here; pass "
                         "embedlab.services.redis_server.redis_to_kill(redis), a local throw-away server")
    sm, key_to_row = _oracle(sparse_dir)
    work = Path(workdir or tempfile.mkdtemp(prefix="embedlab-hps-outage-"))
    work.mkdir(parents=True, exist_ok=True)
    cfg = {"volatile_db": redis.volatile_db(num_partitions=8, initial_cache_rate=1.0, cache_missed_embeddings=True),
           "persistent_db": {"type": "rocks_db", "path": str(work / "rocksdb_outage")},
           "models": [_model("walk", sparse_dir, sm.dim, gpucache=use_native, gpucacheper=gpucacheper)]}
    n = len(stream)
    kill_i, restart_i = int(kill_at * n), (int(restart_at * n) if restart_at is not None else None)

    def on_batch(i):
        if i == kill_i:
            redis.kill()
            return "Redis killed"
        if restart_i is not None and i == restart_i:
            redis.start()
            return "Redis restarted, empty"
        return None
    with ParameterServer(cfg, retry_seconds=0.0) as ps:
        return run_stream("cache -> Redis -> RocksDB" if use_native else "Redis -> RocksDB",
                          ps, "walk", stream, sm.vectors, key_to_row, on_batch)


def slow_lookups(run: StreamRun, factor: float = 2.0, first: int = 0, stop: int | None = None) -> dict:
    """Where the lookups slower than ``factor`` x the median (of batches ``first:stop``) spent
    their excess time.

    Returns:
        ``{"median_ms", "slow": count, "batches": their indices, "excess_ms": their time above the
        median, "off_cpu_share": the part of it this process did not run (wall - CPU time, at
        least 0), "preempted": their involuntary context switches}``.
    """
    lat = np.asarray(run.latency_ms[first:stop])
    cpu = np.asarray(run.cpu_ms[first:stop])
    pre = np.asarray(run.preempted[first:stop])
    med = float(np.median(lat)) if lat.size else float("nan")
    slow = lat > factor * med
    excess = float(np.sum(lat[slow] - med))
    off = float(np.sum(np.clip(lat[slow] - cpu[slow], 0.0, None)))
    return {"median_ms": med, "slow": int(slow.sum()), "batches": (first + np.flatnonzero(slow)).tolist(),
            "excess_ms": excess,
            "off_cpu_share": min(1.0, off / excess) if excess > 0 else 0.0,
            "preempted": int(pre[slow].sum())}


def tier_split(run: StreamRun, first: int = 0, stop: int | None = None) -> dict:
    """Median per lookup over batches ``first:stop``: wall ms; per tier the ms of its finds, the
    keys asked and the rows written into it; ``other_ms``, the time outside the finds (writing
    rows up into Redis and the cache, deduplicating keys, assembling the answer); and
    ``off_cpu_ms``, the wall time this process did not run (waiting for Redis, or preempted)."""
    sl = slice(first, stop)
    lat = np.asarray(run.latency_ms[sl])
    tiers = {t: np.asarray(run.tier_ms[t][sl]) for t in TIERS}
    out = {"latency_ms": float(np.median(lat))}
    for t in TIERS:
        out[f"{t}_ms"] = float(np.median(tiers[t]))
        out[f"{t}_keys"] = float(np.median(np.asarray(run.tier_keys[t][sl])))
    out["other_ms"] = float(np.median(lat - sum(tiers.values())))
    out["off_cpu_ms"] = float(np.median(np.clip(lat - np.asarray(run.cpu_ms[sl]), 0.0, None)))
    for t in TIERS:
        out[f"{t}_inserted"] = float(np.median(np.asarray(run.tier_inserted[t][sl])))
    return out


def outage_report(outage: StreamRun, same_stack: StreamRun, rocks_alone: StreamRun) -> list:
    """Notebook 05's reading of a :func:`redis_outage` run, as sentences chosen from its numbers.

    Args:
        outage: the run with phases "start", "Redis killed" and "Redis restarted, empty".
        same_stack: the same tier stack in :func:`tier_stacks` (interleaved with the others).
        rocks_alone: the "RocksDB only" stack of the same :func:`tier_stacks` call.

    Returns:
        a list of lines: the per-phase table, then the verdicts. A verdict between two sets of
        lookups names a winner only when their interquartile ranges do not overlap
        (:func:`embedlab.tutorials.verdicts.compare`).
    """
    from .verdicts import compare
    spans = {label: (a, b) for label, a, b in outage.phases()}
    for need in ("start", "Redis killed", "Redis restarted, empty"):
        if need not in spans:
            raise ValueError(f"outage_report: the run has no phase {need!r} (phases: {list(spans)})")
    names = {"start": "Redis up"}
    lines = [f"{'phase':24s}{'lookups':>8s}{'median ms':>10s}{'off-CPU ms':>11s}{'Redis ms':>9s}{'RocksDB ms':>11s}"
             f"{'other ms':>9s}{'rows written to Redis':>22s}"]
    ph = {}
    for label, (a, b) in spans.items():
        s = ph[label] = tier_split(outage, a, b)
        w = outage.tier_inserted["volatile"][a:b]
        lines.append(f"{names.get(label, label):24s}{b - a:>8d}{s['latency_ms']:>10.2f}{s['off_cpu_ms']:>11.2f}"
                     f"{s['volatile_ms']:>9.2f}{s['persistent_ms']:>11.2f}{s['other_ms']:>9.2f}{w[0]:>13d} -> {w[-1]:<7d}")
    up, down, back = ph["start"], ph["Redis killed"], ph["Redis restarted, empty"]
    lat = {label: outage.latency_ms[a:b] for label, (a, b) in spans.items()}
    lines.append(f"Redis down: each lookup tries Redis and is refused (median {down['volatile_ms']:.2f} ms in Redis's "
                 f"find), and RocksDB answers the cache's misses ({down['persistent_ms']:.2f} ms); the median lookup "
                 f"took {down['latency_ms']:.2f} ms.")
    lines.append(compare("Redis down", lat["Redis killed"], "Redis up", lat["start"])[1] + ".")
    a, b = spans["Redis restarted, empty"]
    written = outage.tier_inserted["volatile"][a:b]
    vs = outage.stats.get("tiers", {}).get("volatile", {})
    reseed = (f" The server re-seeded Redis in the background: {vs.get('reseeded_rows', 0):,} rows in "
              f"{vs.get('reseeds', 0)} re-seed(s) by the end of the run." if vs.get("reseeds") else "")
    if max(written) == 0:
        lines.append(f"Redis back, empty: no row the cache missed was written into Redis during this phase's {b - a} "
                     f"lookups; RocksDB answered {back['persistent_keys']:.0f} keys of the median lookup.{reseed}")
    else:
        lines.append(f"Redis back, empty: {sum(written):,} rows the cache missed were written into Redis over this "
                     f"phase's {b - a} lookups ({written[0]} at its first lookup, {written[-1]} at its last"
                     + (", fewer as Redis fills up" if written[-1] < written[0] else "") + f").{reseed}")
    half = (b - a) // 2
    if half:
        first, last = tier_split(outage, a, a + half), tier_split(outage, a + half, b)
        lines.append(f"Median lookup in that phase's first half {first['latency_ms']:.2f} ms ({first['off_cpu_ms']:.2f} "
                     f"of them off the CPU), in its second half {last['latency_ms']:.2f} ms ({last['off_cpu_ms']:.2f}); "
                     f"with Redis up, {up['latency_ms']:.2f} ms ({up['off_cpu_ms']:.2f}).")
    # "Redis up" against the same stack one cell earlier, and against RocksDB alone
    before = tier_split(same_stack)
    kind, sentence = compare('"Redis up" in this run', lat["start"], "the same stack one cell earlier",
                             same_stack.latency_ms)
    lines.append(sentence + ".")
    if kind != "noise":
        kr = up["volatile_keys"] / max(1.0, before["volatile_keys"])
        per_up = up["volatile_ms"] / max(1.0, up["volatile_keys"])
        per_before = before["volatile_ms"] / max(1.0, before["volatile_keys"])
        pr = per_up / max(1e-9, per_before)
        lines.append(f"This phase is the stream's first {len(lat['start'])} lookups; its median lookup sends "
                     f"{up['volatile_keys']:.0f} keys to Redis against {before['volatile_keys']:.0f} over the whole "
                     f"stream one cell earlier ({kr:.2f}x), at {1e3 * per_up:.2f} us per key against "
                     f"{1e3 * per_before:.2f} us ({pr:.2f}x).")
        if kr > 1.1:
            lines.append("More keys reach Redis: the cache is still filling in the stream's first half, and the "
                         "earlier median covers the whole stream, its warm second half included.")
        if abs(pr - 1) > 0.1:
            lines.append("Each key costs Redis a different time: the two runs were not interleaved, so the machine's "
                         "load moved between them (the earlier stacks also shared their rounds with each other).")
    rock = tier_split(rocks_alone)
    kind, sentence = compare('"Redis up" in this run', lat["start"], "RocksDB alone (the dashed line)",
                             rocks_alone.latency_ms)
    lines.append(sentence + ".")
    us_redis = 1e3 * up["volatile_ms"] / max(1.0, up["volatile_keys"])
    us_rocks = 1e3 * rock["persistent_ms"] / max(1.0, rock["persistent_keys"])
    if kind == "slower" and us_redis > us_rocks:
        lines.append(f"What the cache leaves costs more through Redis than from RocksDB here: {us_redis:.2f} us per key "
                     f"through Redis (a round trip to another process) against {us_rocks:.2f} us per key from RocksDB "
                     f"(in this process, its table in memory), and the cache takes "
                     f"{1 - up['volatile_keys'] / max(1.0, up['cache_keys']):.0%} of the keys off Redis.")
    return lines


def stacks_report(stacks: list, table_mib: float) -> list:
    """Notebook 05's reading of :func:`tier_stacks` (cache -> hash_map, cache -> Redis -> RocksDB,
    RocksDB only), as sentences chosen from the numbers.

    Args:
        stacks: the three runs, in that order. table_mib: the table's size (MiB).

    Returns:
        a list of lines: what each tier answers and costs per key, the tiered stack against
        RocksDB alone (a winner only outside the noise), and where each stack's slow lookups
        spent their extra time.
    """
    from .verdicts import compare
    if len(stacks) != 3:
        raise ValueError(f"stacks_report: expected the 3 runs of tier_stacks, got {len(stacks)}")
    hm, red, rock = (tier_split(r) for r in stacks)
    us_redis = 1e3 * red["volatile_ms"] / max(1.0, red["volatile_keys"])
    us_rocks = 1e3 * rock["persistent_ms"] / max(1.0, rock["persistent_keys"])
    share = 1 - red["volatile_keys"] / max(1.0, red["cache_keys"])
    lines = [f"The cache answers {share:.0%} of a lookup's {red['cache_keys']:.0f} distinct keys; Redis answers the other "
             f"{red['volatile_keys']:.0f} in {red['volatile_ms']:.2f} ms ({us_redis:.2f} us per key). RocksDB alone answers "
             f"all {rock['persistent_keys']:.0f} in {rock['persistent_ms']:.2f} ms ({us_rocks:.2f} us per key) (medians).",
             f"Per key, Redis costs {us_redis / max(1e-9, us_rocks):.1f}x RocksDB here. RocksDB runs inside this process "
             f"and its whole table ({table_mib:.1f} MiB) stays in memory, so its lookup is a memory read; a Redis lookup "
             f"is a round trip to another process, and this process spent {red['off_cpu_ms']:.2f} ms of the median "
             f"lookup off the CPU (RocksDB alone: {rock['off_cpu_ms']:.2f} ms).",
             "Per lookup, " + compare(stacks[1].name, stacks[1].latency_ms, "RocksDB alone", stacks[2].latency_ms)[1]
             + f". The in-process hash map behind the same cache takes {hm['latency_ms']:.2f} ms."]
    for r in stacks:
        sl = slow_lookups(r)
        if sl["slow"] == 0:
            lines.append(f"{r.name}: no lookup took more than twice the median ({sl['median_ms']:.2f} ms).")
            continue
        off = f"this process was off the CPU for {sl['off_cpu_share']:.0%} of their extra time"
        if sl["off_cpu_share"] < 0.5:
            where = f"this process was working (on the CPU) for {1 - sl['off_cpu_share']:.0%} of their extra time"
        elif sl["preempted"]:
            where = (f"{off}; the lookup's thread was preempted {sl['preempted']} times (ready to run while another "
                     "process or thread had the core)" + (", and waited for redis-server's replies" if "Redis" in r.name
                                                          else ""))
        else:
            where = f"{off}, never preempted: " + ("waiting for redis-server's replies" if "Redis" in r.name
                                                  else "blocked (waiting for I/O or a lock)")
        at = ", ".join(map(str, sl["batches"][:8])) + (", ..." if sl["slow"] > 8 else "")
        lines.append(f"{r.name}: {sl['slow']} of {len(r.latency_ms)} lookups took more than twice the median "
                     f"({sl['median_ms']:.2f} ms), at batches {at}; {where}.")
    return lines


_POINT_KEYS = ("p50_ms", "p99_ms", "rows_per_s", "requests_per_s")


def sweep_rounds(run_sweep, rounds: int = 3) -> list:
    """Runs a load sweep `rounds` times (every point once per round, so a slow spell of the machine
    falls on all points alike) and merges the rounds per (batch, concurrency) point.

    Args:
        run_sweep: callable() -> list of point dicts (`embedlab.serving.sweep`'s: "batch",
            "concurrency", "requests", "p50_ms", "p99_ms", "rows_per_s", "requests_per_s").
        rounds: how many times.

    Returns:
        one dict per point: the medians over rounds of p50_ms, p99_ms, rows_per_s and
        requests_per_s, each round's value under "<key>_rounds", and "requests" summed.

    Example:
        >>> pts = iter([[{"batch": 1, "concurrency": 1, "requests": 5, "p50_ms": v, "p99_ms": v,
        ...               "rows_per_s": 1e3 / v, "requests_per_s": 1e3 / v}] for v in (1.0, 3.0, 2.0)])
        >>> sweep_rounds(lambda: next(pts), rounds=3)[0]["p50_ms"]
        2.0
    """
    if rounds < 1:
        raise ValueError(f"sweep_rounds: rounds must be >= 1, got {rounds}")
    merged = {}
    for _ in range(rounds):
        for p in run_sweep():
            m = merged.setdefault((p["batch"], p["concurrency"]), {"batch": p["batch"], "concurrency": p["concurrency"],
                                                                  "requests": 0, **{k + "_rounds": [] for k in _POINT_KEYS}})
            m["requests"] += p["requests"]
            for k in _POINT_KEYS:
                m[k + "_rounds"].append(float(p[k]))
    for m in merged.values():
        for k in _POINT_KEYS:
            m[k] = float(np.median(m[k + "_rounds"]))
    return list(merged.values())


def serving_report(points: list, cores: int) -> list:
    """Notebook 06's reading of `sweep_rounds`' points, as sentences chosen from the numbers and their
    spread over the rounds: batching (the smallest against the largest batch, one client),
    concurrency (1 against 4 clients at both batch sizes), and the widest tail.

    Args:
        points: `sweep_rounds`' result, with concurrencies 1 and 4. cores: the machine's CPU count.

    Returns:
        a list of lines.
    """
    from .verdicts import compare, compare_rates
    by = {(p["batch"], p["concurrency"]): p for p in points}
    batches = sorted({p["batch"] for p in points})
    lo, hi = batches[0], batches[-1]
    if (lo, 1) not in by or (hi, 1) not in by or (lo, 4) not in by or (hi, 4) not in by:
        raise ValueError(f"serving_report: points need concurrencies 1 and 4 at batches {lo} and {hi}")
    a1, b1, a4, b4 = by[(lo, 1)], by[(hi, 1)], by[(lo, 4)], by[(hi, 4)]
    lines = []
    kind, sentence = compare(f"a request of {hi:,} samples", b1["p50_ms_rounds"], f"a request of {lo}", a1["p50_ms_rounds"])
    lines.append(f"Batching, one client, p50 per round: {sentence}.")
    lines.append(f"Samples per second: {b1['rows_per_s'] / a1['rows_per_s']:,.0f}x for {hi // lo:,}x the samples per "
                 "request (medians over the rounds).")
    if kind == "slower":
        per_sample = (b1["p50_ms"] - a1["p50_ms"]) / (hi - lo)
        fixed = a1["p50_ms"] - per_sample * lo
        lines.append(f"A straight line through those two points costs a request {fixed:.2f} ms plus "
                     f"{1e3 * per_sample:.1f} us per sample: the fixed part (HTTP, the ensemble's two python-backend "
                     f"hops) is {fixed / a1['p50_ms']:.0%} of a {lo}-sample request and {fixed / b1['p50_ms']:.0%} of a "
                     f"{hi:,}-sample one.")
    else:
        lines.append(f"Within that noise, a request's time does not grow with its samples up to {hi:,}: it is the "
                     "fixed cost of a request (HTTP, the ensemble's two python-backend hops) that a batch shares.")
    for b, one, four in ((lo, a1, a4), (hi, b1, b4)):
        kind, sentence = compare_rates("4 clients", four["rows_per_s_rounds"], "one client", one["rows_per_s_rounds"],
                                       " samples/s")
        why = {"higher": "requests overlap: one is in HTTP or a stub while another computes",
               "noise": "no gain or loss that this run can tell from its noise",
               "lower": f"the {cores} cores, shared by the server, its two stubs and the clients, are busy, and "
                        "4 clients add switching between them"}[kind]
        lines.append(f"Concurrency at batch {b:,}: {sentence} ({why}); the p50 goes from {one['p50_ms']:.2f} to "
                     f"{four['p50_ms']:.2f} ms.")
    worst = max(points, key=lambda p: p["p99_ms"] / p["p50_ms"])
    lines.append(f"Tail: the widest p99/p50 gap is at batch {worst['batch']:,} with {worst['concurrency']} client(s): "
                 f"1 request in 100 took {worst['p99_ms']:.2f} ms or more, {worst['p99_ms'] / worst['p50_ms']:.1f}x "
                 f"the median, on {cores} cores that the server, its stubs, the client threads and any other process "
                 "share.")
    return lines
