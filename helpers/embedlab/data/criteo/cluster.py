"""The Dask plumbing of the Criteo jobs: which cluster, running tasks on it, and their output.

- `local_client`, `resolve_client` (a `Client`, a scheduler address, "local", or the scheduler
  that `EMBEDLAB_DASK_SCHEDULER` names), `worker_peak_rss`, `dashboard_link`;
- `ClusterJob`: one run's tasks on a client (keys unique to the run, every future kept so that
  a failure cancels them all, results gathered in order with a progress bar, and a task that
  failed for good turned into a `ChunkFailedError` naming its piece of the input);
- `remove_tree`, `swap_into_place`: the temporary output folder of a run, removed on failure
  or renamed onto the destination at the end.

Dask is imported only when a function here runs.

Example (a LocalCluster of one worker process on 127.0.0.1, a few seconds):
    >>> with local_client(n_workers=1) as client:
    ...     job = ClusterJob(client)
    ...     futs = [job.submit(pow, 2, k, key=f"pow-{k}") for k in range(3)]
    ...     job.gather(futs)
    [1, 2, 4]
"""
from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid

__all__ = ["SCHEDULER_ENV", "ChunkFailedError", "local_client", "resolve_client",
           "worker_peak_rss", "dashboard_link", "ClusterJob", "remove_tree", "swap_into_place"]

SCHEDULER_ENV = "EMBEDLAB_DASK_SCHEDULER"


class ChunkFailedError(RuntimeError):
    """A chunk's task failed on the cluster (e.g. it killed its workers too often)."""


@contextlib.contextmanager
def local_client(n_workers: int | None = None, *, memory_limit="auto",
                 cpu_threads: int | None = None):
    """A `LocalCluster` on 127.0.0.1 and a `Client` to it, both closed on exit.

    One worker process per core by default, one thread each (the ETL's NumPy / pyarrow work
    holds the GIL in places; processes scale, threads would not). The scheduler's HTTP server
    (the dashboard, with bokeh installed) listens on a free port of 127.0.0.1
    (`client.dashboard_link`).

    Args:
        n_workers: worker processes (default `os.cpu_count()`).
        memory_limit: per worker, as `LocalCluster` takes it ("auto": the machine's memory
            shared equally).
        cpu_threads: threads of each worker's native thread pool (pyarrow's CSV parser; set
            through OMP_NUM_THREADS). Default: the cores shared equally, `os.cpu_count() //
            n_workers` (at least 1), so that one worker alone still uses every core. 1 gives
            every worker the same single thread whatever their number (what a strong-scaling
            measurement wants, `helpers/benchmarks/etl.py`).

    Returns:
        A context manager yielding the `distributed.Client`.

    Raises:
        ValueError: `n_workers` or `cpu_threads` below 1.

    Example: the module's (a cluster of one worker).
    """
    from distributed import Client, LocalCluster
    n = int(n_workers) if n_workers is not None else (os.cpu_count() or 1)
    if n < 1:
        raise ValueError(f"local_client: n_workers must be >= 1, got {n_workers}")
    import dask
    # Two settings of Dask's nanny slow this ETL down. MALLOC_TRIM_THRESHOLD_=65536 (set before
    # the worker starts) makes glibc return freed memory at once, so every large NumPy /
    # pyarrow temporary is a fresh mmap with fresh page faults, and parsing a chunk in a worker
    # becomes several times slower than in a plain process. OMP_NUM_THREADS=1 also
    # caps pyarrow's thread pool (the CSV parser): each worker gets its share of the cores.
    share = max(1, (os.cpu_count() or 1) // n) if cpu_threads is None else int(cpu_threads)
    if share < 1:
        raise ValueError(f"local_client: cpu_threads must be >= 1, got {cpu_threads}")
    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address="127.0.0.1:0",
                               memory_limit=memory_limit, silence_logs=logging.ERROR,
                               env={"OMP_NUM_THREADS": str(share)})
    try:
        client = Client(cluster)
        try:
            yield client
        finally:
            client.close()
    finally:
        cluster.close()


@contextlib.contextmanager
def resolve_client(client):
    """The `Client` that `client` names, as a context manager (closes what it opened).

    Args:
        client: a `distributed.Client` (used as is), "local" (`local_client()`), a scheduler
            address ("tcp://host:8786"), or None: the scheduler named by `EMBEDLAB_DASK_SCHEDULER`.

    Returns:
        A context manager yielding the `distributed.Client`.

    Raises:
        ValueError: None and the variable unset.
        ConnectionError: an address that does not answer.
        TypeError: anything else.

    Example:
        >>> with resolve_client("local") as c:           # doctest: +SKIP
        ...     len(c.scheduler_info()["workers"]) >= 1
        True
    """
    if client is None:
        addr = os.environ.get(SCHEDULER_ENV, "").strip()
        if not addr:
            raise ValueError(f"no Dask cluster: pass client=... or set {SCHEDULER_ENV}")
        client = addr
    if isinstance(client, str):
        if client == "local":
            with local_client() as c:
                yield c
            return
        from distributed import Client
        try:
            c = Client(client, timeout=30)
        except OSError as e:
            raise ConnectionError(f"cannot reach the Dask scheduler at {client!r}: {e}") from e
        try:
            yield c
        finally:
            c.close()
        return
    from distributed import Client
    if not isinstance(client, Client):
        raise TypeError(f"client must be a distributed.Client, a scheduler address, 'local' or "
                        f"None, got {type(client).__name__}")
    yield client


def worker_peak_rss(client) -> dict:
    """Peak resident memory of each worker process so far, in bytes ({worker address: bytes}).

    Linux only (the VmHWM line of /proc/self/status).

    Example:
        >>> with local_client(1) as c:                    # doctest: +SKIP
        ...     min(worker_peak_rss(c).values()) > 0
        True
    """
    return client.run(_peak_rss)


def _peak_rss() -> int:
    # VmHWM: the high-water mark of this process's own memory since it was exec'd. (getrusage's
    # ru_maxrss is no good here: Linux carries it over exec, so a worker spawned from a
    # Jupyter kernel would report the kernel's size.)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("worker_peak_rss needs Linux's /proc/self/status")


def dashboard_link(client) -> str | None:
    """The address of the scheduler's dashboard, or None when it serves none (no bokeh)."""
    try:
        services = client.scheduler_info().get("services", {})
    except Exception:                                                     # pragma: no cover
        return None
    return client.dashboard_link if "dashboard" in services else None


class ClusterJob:
    """One run's tasks on `client`.

    Every task key ends in a run id (`run`), so two runs on one cluster never share results.
    Every future submitted is kept in `futures` until `release()`: the cluster holds a result
    while a future names it, and `cancel()` (on failure) cancels them all. `gather` names what
    failed after the piece of input each task was given (`piece=`, anything with `describe()`).

    Args:
        client: a `distributed.Client`. job: the job's name, for error messages.

    Example: the module's.
    """

    def __init__(self, client, job: str = "preprocess"):
        self.client, self.job = client, job
        self.run = uuid.uuid4().hex[:8]
        self.futures: list = []
        self._pieces: dict = {}
        self._weights: dict = {}

    def submit(self, fn, *args, key: str, piece=None, weight: int | None = None, **kw):
        """`client.submit(fn, *args, **kw)` under key `<key>-<run>`; `piece` is named when the
        task fails, `weight` is its share of a progress bar (default 1)."""
        f = self.client.submit(fn, *args, key=f"{key}-{self.run}", pure=False, **kw)
        self.futures.append(f)
        if piece is not None:
            self._pieces[f.key] = piece
        if weight is not None:
            self._weights[f.key] = weight
        return f

    def name_like(self, fut, other) -> None:
        """Name `other`'s piece of input when `fut` fails (a task that reads `other`'s result)."""
        if other.key in self._pieces:
            self._pieces[fut.key] = self._pieces[other.key]

    def gather(self, futs, bar=None, fetch: bool = True) -> list:
        """Results of `futs` in order (None each with fetch=False: the results stay on the
        workers), advancing `bar` by each task's weight as it finishes.

        Raises:
            ChunkFailedError: a task failed for good (its workers died more often than
                `distributed.scheduler.allowed-failures`), naming the job and the task's piece.
        """
        from distributed import as_completed
        from distributed.scheduler import KilledWorker
        out = {}
        for fut in as_completed(futs):
            try:
                if fetch or fut.status != "finished":
                    out[fut.key] = fut.result()
            except KilledWorker as e:
                piece = self._pieces.get(fut.key)
                what = piece.describe() if piece is not None else f"task {fut.key}"
                raise ChunkFailedError(
                    f"{self.job} on Dask: {what} failed: the workers running it died more often "
                    f"than distributed.scheduler.allowed-failures allows ({e}); nothing was "
                    f"written") from e
            if bar is not None:
                bar.update(self._weights.get(fut.key, 1))
        return [out.get(f.key) for f in futs]

    def release(self) -> None:
        """Forget the futures submitted so far (the cluster frees results no one names)."""
        self.futures.clear()

    def cancel(self) -> None:
        """Cancel every future submitted since the last `release()`, and forget them."""
        for f in self.futures:
            f.cancel()
        self.futures.clear()


def remove_tree(fs, path: str) -> None:
    """Remove the folder `path` of fsspec file system `fs`, retrying while it reappears."""
    # A cancelled task that was already running may still finish writing one part into the
    # folder while it is being removed: try again until it is gone (parts never recreate it).
    for _ in range(20):
        with contextlib.suppress(Exception):
            fs.rm(path, recursive=True)
        if not fs.exists(path):
            return
        time.sleep(0.5)


def swap_into_place(fs, tmp: str, out_path: str, local_out: bool) -> None:
    """Rename the finished temporary folder `tmp` onto `out_path`, replacing an old one.

    Local paths (`local_out`, `fs` unused) are renamed, which is atomic; on an object store
    (`fs`) the folder is moved, which is a copy.
    """
    if local_out:
        import shutil
        if os.path.exists(out_path):
            old = f"{tmp}.old"
            os.replace(out_path, old)
            os.replace(tmp, out_path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_path)
        return
    if fs.exists(out_path):
        fs.rm(out_path, recursive=True)
    fs.mv(tmp, out_path, recursive=True)
