"""embedlab.data.criteo.etl_dask: the Criteo ETL on a Dask cluster gives the single-process output.

Clusters are real: LocalClusters of 1, 2 and 3 worker processes on 127.0.0.1, and a scheduler
and two workers started from the command line (`dask scheduler`, `dask worker`), the way one
starts them on several machines. A worker killed mid-run (SIGKILL to its process) is retried
by Dask with identical output; with retries switched off the run fails naming the chunk and
leaves nothing behind. The per-part Norm conversion (`etl_dask.parquet_to_norm`) writes the
single-process `formats.parquet_to_norm` files byte for byte on 1 and 2 workers, and a worker
killed mid-conversion is handled the same two ways (rerun, byte-identical; or, without retries,
an error naming the part and nothing left). The kills go through `kill_worker_during`
(conftest.py).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from embedlab.data import criteo
from embedlab.data.criteo import etl_dask

pytestmark = pytest.mark.filterwarnings("ignore:preprocess skipped")


# ----------------------------------------------------------------------------- helpers

def _table(res, split):
    return pa.concat_tables([pq.read_table(f) for f in res.files[split]])


def assert_same_output(a, b):
    """Same vocabularies (slot sizes, offsets), dense ranges, metadata and rows, row for row."""
    assert a.slot_size_array == b.slot_size_array
    assert a.offsets == b.offsets and a.columns == b.columns
    assert a.dense_min == b.dense_min and a.dense_max == b.dense_max
    assert a.rows == b.rows
    assert (a.malformed, a.errors) == (b.malformed, b.errors)
    assert (Path(a.dst) / "slot_size_array.json").read_text() == \
        (Path(b.dst) / "slot_size_array.json").read_text()
    ma = json.loads((Path(a.dst) / "metadata.json").read_text())
    mb = json.loads((Path(b.dst) / "metadata.json").read_text())
    for k in ma:
        if k not in ("seconds", "files", "source"):
            assert ma[k] == mb[k], k
    for split in criteo.SPLIT_NAMES:
        ta, tb = _table(a, split), _table(b, split)
        assert ta.schema == tb.schema
        assert ta.equals(tb), split
    # The parts' sorted names are the row order too (what formats.parquet_files reads).
    for split in criteo.SPLIT_NAMES:
        assert b.files[split] == sorted(b.files[split])


KW = dict(freq_threshold=3, row_group_rows=1000, on_error="skip", progress=False)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, run_seed):
    """Two input files (12,000 generated lines; the second has a malformed line and no final
    newline) and the single-process output over them."""
    d = tmp_path_factory.mktemp("criteo_dask")
    full = criteo.generate(d / "all.txt", rows=12_000, seed=run_seed, progress=False)
    lines = full.read_bytes().splitlines(keepends=True)
    a, b = d / "a.txt", d / "b.txt"
    a.write_bytes(b"".join(lines[:7_000]))
    rest = lines[7_000:]
    rest[1_234] = b"1\tnot-a-number" + rest[1_234][rest[1_234].index(b"\t", 2):]
    b.write_bytes(b"".join(rest)[:-1])
    ref = criteo.preprocess([a, b], d / "single", **KW)
    assert ref.malformed == 1
    return d, [a, b], ref


# ----------------------------------------------------------------------------- chunks

def test_byte_ranges_own_every_line_once(tmp_path, rng):
    """Every line is read by exactly one chunk, whatever the chunk size, CRLF or no final newline."""
    from fsspec.implementations.local import LocalFileSystem
    lines = [b"x" * int(n) + (b"\r\n" if rng.random() < 0.3 else b"\n")
             for n in rng.integers(0, 30, 200)]
    for tail in (b"", b"last line without newline"):
        p = tmp_path / "f.txt"
        data = b"".join(lines) + tail
        p.write_bytes(data)
        want = data.splitlines(keepends=True)
        for size, workers in [(1, 1), (2, 1), (3, 2), (7, 1), (31, 3), (64, 2), (1000, 1),
                              (1000, 3), (len(data), 2)]:
            urls, chunks = etl_dask._plan(str(p), size, workers)
            assert isinstance(chunks[0].fs, LocalFileSystem)
            lengths = [ch.end - ch.start for ch in chunks]
            assert max(lengths) <= size and max(lengths) - min(lengths) <= 1, (size, workers)
            assert len(chunks) == 1 or len(chunks) % workers == 0, (size, workers)
            got = []
            for ch in chunks:
                n = etl_dask._count_task(ch)
                buf = etl_dask._read_lines(ch, n).tobytes()
                got.extend(buf.splitlines(keepends=True))
            if tail:
                want_n = want[:-1] + [tail + b"\n"]
            else:
                want_n = want
            assert got == want_n, size


def test_output_digest_sees_one_changed_value(inputs, tmp_path):
    d, paths, ref = inputs
    t = pq.read_table(ref.files["val"][0])
    col = t.column("C7").to_numpy().copy()
    col[len(col) // 2] += 1
    changed = tmp_path / "changed.parquet"
    pq.write_table(t.set_column(t.schema.get_field_index("C7"), "C7", pa.array(col)), changed)
    other = criteo.PreprocessResult(**{**ref.__dict__, "files": {**ref.files, "val": [changed]}})
    a, b = etl_dask.output_digest(ref), etl_dask.output_digest(other)
    assert a != b and a["splits"]["val"]["C7"] != b["splits"]["val"]["C7"]
    assert a["splits"]["val"]["C8"] == b["splits"]["val"]["C8"]


def test_bad_arguments(inputs, tmp_path, monkeypatch):
    d, paths, _ = inputs
    monkeypatch.delenv(etl_dask.SCHEDULER_ENV, raising=False)
    with pytest.raises(TypeError, match="client"):
        criteo.preprocess(paths, tmp_path / "x", client=42, progress=False)
    with pytest.raises(FileNotFoundError, match="nope"):
        criteo.preprocess(tmp_path / "nope.txt", tmp_path / "x", client="local", progress=False)
    with pytest.raises(ValueError, match="no Dask cluster"):
        with etl_dask.resolve_client(None):
            pass
    assert not (tmp_path / "x").exists()


# ----------------------------------------------------------------------------- LocalCluster

@pytest.fixture(scope="module", params=[1, 2, 3], ids=lambda n: f"{n}workers")
def local(request):
    with etl_dask.local_client(request.param) as client:
        yield request.param, client


@pytest.mark.parametrize("chunk_bytes", [150_000, 1 << 20])
def test_identical_to_single_process(inputs, local, chunk_bytes, tmp_path):
    d, paths, ref = inputs
    n, client = local
    res = criteo.preprocess(paths, tmp_path / "out", chunk_bytes=chunk_bytes, client=client, **KW)
    assert_same_output(ref, res)
    assert etl_dask.output_digest(ref) == etl_dask.output_digest(res)
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["dask"]["workers"] == n
    assert meta["dask"]["chunks"] > (2 if chunk_bytes == 1 << 20 else 10)
    assert not [p for p in tmp_path.iterdir() if p.name != "out"]      # no temporary folder
    rss = etl_dask.worker_peak_rss(client)
    assert len(rss) == n and all(50 << 20 < v < 8 << 30 for v in rss.values()), rss


def test_malformed_line_fails_with_its_file_and_line(inputs, local, tmp_path):
    d, paths, _ = inputs
    n, client = local
    if n != 2:
        pytest.skip("one cluster size is enough for the error path")
    with pytest.raises(criteo.CriteoFormatError) as e:
        criteo.preprocess(paths, tmp_path / "out", freq_threshold=3, chunk_bytes=200_000,
                          client=client, progress=False)
    assert e.value.path == str(paths[1]) and e.value.line == 1_235
    assert not list(tmp_path.iterdir())


# ----------------------------------------------------------------------------- killed worker

@pytest.fixture(scope="module")
def big_input(tmp_path_factory, run_seed):
    """60,000 lines in chunks of 4 MB: a pass-2 task runs long enough to be killed."""
    d = tmp_path_factory.mktemp("criteo_dask_kill")
    txt = criteo.generate(d / "day.txt", rows=60_000, seed=run_seed + 1, progress=False)
    return txt, d

@pytest.fixture(scope="module")
def big_ref(big_input):
    """The single-process output of `big_input`."""
    txt, d = big_input
    return criteo.preprocess(txt, d / "single", **KW)


def test_killed_worker_is_retried_with_identical_output(big_input, big_ref, tmp_path,
                                                        kill_worker_during):
    txt, d = big_input
    with etl_dask.local_client(2) as client:
        out, killed = kill_worker_during(
            client, lambda: criteo.preprocess(txt, tmp_path / "out", chunk_bytes=4 << 20,
                                              client=client, **KW), "etl-pass2")
        assert "err" not in out, out.get("err")
        client.wait_for_workers(2, timeout=60)             # the nanny restarted it
        assert killed not in client.run(os.getpid).values()
    assert_same_output(big_ref, out["res"])
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_killed_worker_without_retries_names_the_chunk_and_leaves_nothing(big_input, tmp_path,
                                                                         kill_worker_during):
    import dask
    txt, d = big_input
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with etl_dask.local_client(2) as client:
            out, _ = kill_worker_during(
                client, lambda: criteo.preprocess(txt, tmp_path / "out", chunk_bytes=4 << 20,
                                                  client=client, **KW), "etl-pass2")
    err = out.get("err")
    assert isinstance(err, etl_dask.ChunkFailedError), out
    assert "chunk" in str(err) and "bytes" in str(err) and "nothing was written" in str(err)
    assert not list(tmp_path.iterdir())                    # no output, no temporary folder


# ----------------------------------------------------------------------------- command line

def test_command_line_scheduler_and_workers(inputs, tmp_path, monkeypatch):
    """`dask scheduler` + two `dask worker` processes on 127.0.0.1, found through
    EMBEDLAB_DASK_SCHEDULER with client=None; input and output as file:// URLs."""
    d, paths, ref = inputs
    dask_cli = str(Path(sys.executable).parent / "dask")
    sched_file = tmp_path / "scheduler.json"
    # What the README tells users of `dask worker`: unset the nanny's MALLOC_TRIM_THRESHOLD_.
    cfg = tmp_path / "dask-config"
    cfg.mkdir()
    (cfg / "embedlab.yaml").write_text(
        "distributed:\n  nanny:\n    pre-spawn-environ:\n      MALLOC_TRIM_THRESHOLD_: null\n")
    env = dict(os.environ, DASK_LOGGING__DISTRIBUTED="error", DASK_CONFIG=str(cfg))
    env.pop("MALLOC_TRIM_THRESHOLD_", None)
    procs = [subprocess.Popen([dask_cli, "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--no-dashboard", "--scheduler-file", str(sched_file)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)]
    try:
        deadline = time.monotonic() + 120
        while not sched_file.exists():
            assert procs[0].poll() is None, procs[0].stderr.read().decode()
            assert time.monotonic() < deadline, "the scheduler did not start"
            time.sleep(0.2)
        time.sleep(0.2)
        addr = json.loads(sched_file.read_text())["address"]
        assert addr.startswith("tcp://127.0.0.1:")
        for _ in range(2):
            procs.append(subprocess.Popen(
                [dask_cli, "worker", addr, "--nworkers", "1", "--nthreads", "1",
                 "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(tmp_path)],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from distributed import Client
        with Client(addr, timeout=60) as c:
            c.wait_for_workers(2, timeout=120)
            trim = c.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
            assert set(trim.values()) == {None}, trim
        monkeypatch.setenv(etl_dask.SCHEDULER_ENV, addr)
        res = criteo.preprocess([f"file://{p}" for p in paths], f"file://{tmp_path}/out",
                                chunk_bytes=300_000, **KW)
        assert json.loads((tmp_path / "out" / "metadata.json").read_text())["dask"]["workers"] == 2
        ref_errors = [(f"file://{p}", l, r) for p, l, r in ref.errors]
        assert res.errors == ref_errors
        res.errors = ref.errors
        assert_same_output(ref, res)
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


# ----------------------------------------------------------------------------- Norm conversion

def assert_same_files(a: Path, b: Path) -> list:
    """Folders a and b hold the same file names with the same bytes; returns the names."""
    names = sorted(p.name for p in a.iterdir())
    assert sorted(p.name for p in b.iterdir()) == names
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    return names


NORM_CASES = {
    # data files cut across row groups and parts, tasks across file lists
    "lists": dict(samples_per_file=700, files_per_list=4, files_per_task=3),
    # one list; a 2-column multi-hot slot first, int64 keys, no checksums
    "multihot": dict(samples_per_file=2_500, key_type="int64", error_check=False,
                     slots=[["C1_C2", "C3_C4"], "C1", "C2", "C5"], dense=["I1", "I3"]),
}


@pytest.mark.parametrize("case", list(NORM_CASES))
def test_parquet_to_norm_identical_to_single_process(inputs, local, case, tmp_path, monkeypatch):
    """The per-part conversion writes the single-process conversion's files, byte for byte."""
    from embedlab.data import formats
    d, paths, ref = inputs
    n, client = local
    if n == 3:
        pytest.skip("1 and 2 workers are enough for the conversion")
    kw = dict(NORM_CASES[case])
    parts = [ref.files[s][0] for s in criteo.SPLIT_NAMES]          # 3 parts, 1,000-row groups
    assert all(pq.ParquetFile(p).metadata.num_row_groups > 1 for p in parts[:1])
    for side in ("single", "dask"):
        (tmp_path / side).mkdir()
    # Relative out_dir: the file lists name it as given, so both lists read the same.
    monkeypatch.chdir(tmp_path / "single")
    want = formats.parquet_to_norm(parts, "norm", progress=False,
                                   **{k: v for k, v in kw.items() if k != "files_per_task"})
    digest = etl_dask.norm_digest(want)
    monkeypatch.chdir(tmp_path / "dask")
    got = etl_dask.parquet_to_norm(parts, "norm", progress=False, client=client, **kw)
    assert got == want
    assert etl_dask.norm_digest(got) == digest
    a, b = tmp_path / "single" / "norm", tmp_path / "dask" / "norm"
    names = assert_same_files(a, b)
    assert sum(x.endswith(".data") for x in names) == -(-sum(ref.rows.values())
                                                        // kw["samples_per_file"])
    assert sum(x.endswith(".keyset") for x in names) == len(want) > 0
    assert formats.read_keyset(b / "file_list.keyset" if case == "multihot"
                               else b / "file_list.0.keyset", key_type=kw.get("key_type", "uint32")).size
    assert sorted(p.name for p in (tmp_path / "dask").iterdir()) == ["norm"]   # no temporary


def test_norm_digest_sees_one_changed_byte(inputs, tmp_path):
    """Two conversions into two folders digest equal; one byte of a data file or of the keyset
    changed and they do not."""
    from embedlab.data import formats
    d, paths, ref = inputs
    a, b = (formats.parquet_to_norm(ref.files["val"], tmp_path / n, samples_per_file=300,
                                    progress=False) for n in ("a", "b"))
    assert etl_dask.norm_digest(a) == etl_dask.norm_digest(b)
    for name in ("part_1.data", "file_list.keyset"):
        f = tmp_path / "b" / name
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 1
        f.write_bytes(bytes(data))
        assert etl_dask.norm_digest(a) != etl_dask.norm_digest(b), name
        data[len(data) // 2] ^= 1
        f.write_bytes(bytes(data))


def test_parquet_to_norm_failing_part_leaves_nothing(inputs, local, tmp_path):
    """A part the workers cannot convert (a column missing) fails the run; nothing is left."""
    d, paths, ref = inputs
    n, client = local
    if n != 2:
        pytest.skip("one cluster size is enough for the error path")
    bad = tmp_path / "bad.parquet"
    t = pq.read_table(ref.files["val"][0])
    pq.write_table(t.drop_columns(["I2"]), bad)
    with pytest.raises(Exception, match="I2"):
        etl_dask.parquet_to_norm([ref.files["train"][0], bad], tmp_path / "norm",
                                    samples_per_file=1_000, files_per_task=2, progress=False,
                                    client=client)
    assert [p.name for p in tmp_path.iterdir()] == ["bad.parquet"]


# 48,000 training rows: 48 data files in 12 tasks of 4, 5 file lists.
NORM_KILL = dict(samples_per_file=1_000, files_per_list=10)


def test_killed_worker_during_norm_is_retried_byte_identical(big_ref, tmp_path, monkeypatch,
                                                             kill_worker_during):
    """A worker killed while it converts a part: Dask reruns the part elsewhere and the files
    are still the single-process conversion's, byte for byte."""
    from embedlab.data import formats
    parts = big_ref.files["train"]
    for side in ("single", "dask"):
        (tmp_path / side).mkdir()
    monkeypatch.chdir(tmp_path / "single")
    want = formats.parquet_to_norm(parts, "norm", progress=False, **NORM_KILL)
    monkeypatch.chdir(tmp_path / "dask")
    with etl_dask.local_client(2) as client:
        out, killed = kill_worker_during(
            client, lambda: etl_dask.parquet_to_norm(parts, "norm", progress=False,
                                                        client=client, files_per_task=4,
                                                        **NORM_KILL), "norm-part")
        assert "err" not in out, out.get("err")
        client.wait_for_workers(2, timeout=60)             # the nanny restarted it
        assert killed not in client.run(os.getpid).values()
    assert out["res"] == want
    names = assert_same_files(tmp_path / "single" / "norm", tmp_path / "dask" / "norm")
    assert sum(n.endswith(".data") for n in names) == 48
    assert sorted(p.name for p in (tmp_path / "dask").iterdir()) == ["norm"]   # no temporary


def test_killed_worker_during_norm_without_retries_names_the_part(big_ref, tmp_path,
                                                                  kill_worker_during):
    """With retries off, the killed part fails the run: a ChunkFailedError names its data files
    and rows, and neither the output folder nor its temporary is left."""
    import dask
    parts = big_ref.files["train"]
    with dask.config.set({"distributed.scheduler.allowed-failures": 0}):
        with etl_dask.local_client(2) as client:
            out, _ = kill_worker_during(
                client, lambda: etl_dask.parquet_to_norm(
                    parts, tmp_path / "norm", progress=False, client=client, files_per_task=4,
                    **NORM_KILL), "norm-part")
    err = out.get("err")
    assert isinstance(err, etl_dask.ChunkFailedError), out
    import re
    assert re.search(r"parquet_to_norm on Dask: Norm files \d+-\d+ \(rows [\d,]+-[\d,]+\) "
                     r"failed", str(err)), str(err)
    assert "nothing was written" in str(err)
    assert not list(tmp_path.iterdir())                    # no output, no temporary folder


# ----------------------------------------------------------------------------- killed client

def _temporary_of_a_killed_writer(target: Path) -> Path:
    """A temporary folder of `target` named by a writer process that is then SIGKILLed."""
    code = ("import sys, time; from embedlab._io import temporary_path; "
            "p = temporary_path(sys.argv[1]); p.mkdir(); (p / 'part').write_bytes(b'x' * 1000); "
            "print(p, flush=True); time.sleep(60)")
    child = subprocess.Popen([sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, text=True)
    tmp = Path(child.stdout.readline().strip())
    child.kill()
    child.wait()
    assert tmp.is_dir() and tmp.name.startswith(f".{target.name}.tmp-")
    return tmp


def test_next_run_removes_a_killed_runs_temporaries(inputs, local, tmp_path, caplog):
    """The ETL and the Norm conversion on Dask each remove the temporary folder that a killed
    client left beside their output (and log it), then write as usual."""
    d, paths, ref = inputs
    n, client = local
    if n != 1:
        pytest.skip("one cluster size is enough")
    out = tmp_path / "out"
    stale = _temporary_of_a_killed_writer(out)
    with caplog.at_level("WARNING", logger="embedlab.io"):
        res = criteo.preprocess(paths, out, client=client, **KW)
    assert_same_output(ref, res)
    assert not stale.exists() and str(stale) in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == ["out"]

    norm = tmp_path / "norm"
    stale = _temporary_of_a_killed_writer(norm)
    etl_dask.parquet_to_norm(ref.files["val"], norm, samples_per_file=300, progress=False, client=client)
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["norm", "out"]
