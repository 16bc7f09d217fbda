"""embedlab._io: atomic file / folder writers (with and without fsync) and HugeCTR file lists."""
import os

import pytest

from embedlab import _io


def _names(folder):
    return sorted(os.listdir(folder))


@pytest.mark.parametrize("fsync", [False, True])
def test_atomic_file_writes_replaces_and_leaves_nothing_on_failure(tmp_path, monkeypatch, fsync):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(_io.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    target = tmp_path / "sub" / "f.bin"
    with _io.atomic_file(target, fsync=fsync) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".f.bin.tmp-")
        tmp.write_bytes(b"one")
        assert not target.exists()
    assert target.read_bytes() == b"one" and _names(target.parent) == ["f.bin"]
    assert len(synced) == (2 if fsync else 0)          # the file before the rename, the folder after
    with _io.atomic_file(target, fsync=fsync) as tmp:
        tmp.write_bytes(b"two")
    assert target.read_bytes() == b"two" and _names(target.parent) == ["f.bin"]
    with pytest.raises(RuntimeError, match="crash"):
        with _io.atomic_file(target, fsync=fsync) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("crash")
    assert target.read_bytes() == b"two" and _names(target.parent) == ["f.bin"]


def test_atomic_file_failed_rename_keeps_old_file(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def boom(*_a, **_k):
        raise OSError("simulated crash")

    monkeypatch.setattr(_io.os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        with _io.atomic_file(target, fsync=True) as tmp:
            tmp.write_bytes(b"new")
    assert target.read_bytes() == b"old" and _names(tmp_path) == ["f.bin"]


@pytest.mark.parametrize("fsync", [False, True])
def test_atomic_dir_builds_swaps_and_cleans_up(tmp_path, monkeypatch, fsync):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(_io.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    target = tmp_path / "model"
    with _io.atomic_dir(target, fsync=fsync) as tmp:
        (tmp / "a").write_text("1")
        (tmp / "d").mkdir()
        (tmp / "d" / "b").write_text("2")
        assert not target.exists()
    assert _names(target) == ["a", "d"] and (target / "d" / "b").read_text() == "2"
    # files a, d/b; folders d, the temporary root; then the parent after the rename
    assert len(synced) == (5 if fsync else 0)
    with _io.atomic_dir(target, fsync=fsync) as tmp:
        (tmp / "c").write_text("3")
    assert _names(target) == ["c"] and _names(tmp_path) == ["model"]
    with pytest.raises(RuntimeError, match="crash"):
        with _io.atomic_dir(target, fsync=fsync) as tmp:
            (tmp / "half").write_text("x")
            raise RuntimeError("crash")
    assert _names(target) == ["c"] and _names(tmp_path) == ["model"]


def test_file_list_round_trip_and_relative_paths(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    files = [data / f"f{i}.data" for i in range(3)]
    for f in files:
        f.write_bytes(b"")
    fl = _io.write_file_list(data / "list.txt", files)
    assert fl.read_text() == "3\n" + "".join(f"{f}\n" for f in files)
    assert _io.read_file_list(fl) == files
    # Relative paths: beside the list when the working directory has no such file...
    monkeypatch.chdir(tmp_path)
    _io.write_file_list(fl, ["f0.data", "f1.data"])
    assert _io.read_file_list(fl) == [data / "f0.data", data / "f1.data"]
    # ... and relative to the working directory when it has one (HugeCTR's rule).
    (tmp_path / "f0.data").write_bytes(b"")
    assert _io.read_file_list(fl) == [_io.Path("f0.data"), data / "f1.data"]
    _io.write_file_list(fl, ["f0.data", "nowhere.data"])
    with pytest.raises(_io.FormatError, match=r"list.txt: line 3: data file nowhere.data does not exist"):
        _io.read_file_list(fl)
    assert _io.read_file_list(fl, check_exists=False) == [_io.Path("f0.data"), data / "nowhere.data"]


@pytest.mark.parametrize("text, match", [
    (None, r"file list .*list.txt does not exist"),
    ("", r"line 1 must be the number of files, got '\(empty file\)'"),
    ("two\na\n", r"line 1 must be the number of files, got 'two'"),
    ("3\na\nb\n", r"line 1 says 3 files but lists 2"),
])
def test_read_file_list_errors_name_list_and_line(tmp_path, text, match):
    fl = tmp_path / "list.txt"
    if text is not None:
        fl.write_text(text)
    with pytest.raises(_io.FormatError, match=match):
        _io.read_file_list(fl, check_exists=False)
    assert issubclass(_io.FormatError, ValueError)


# ---- temporaries of killed writers -----------------------------------------------------------

_WRITER = r"""
import os, sys, time
from pathlib import Path
from embedlab import _io
target, kind = Path(sys.argv[1]), sys.argv[2]
ctx = _io.atomic_dir(target) if kind == "dir" else _io.atomic_file(target)
with ctx as tmp:
    if kind == "dir":
        (tmp / "part").write_bytes(b"x" * 1000)
    else:
        tmp.write_bytes(b"x" * 1000)
    print(tmp, flush=True)
    time.sleep(600)
"""


def _start_writer(target, kind):
    """A child process that writes `target` and then hangs inside the writer's block."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.Popen([sys.executable, "-c", _WRITER, str(target), kind], stdout=subprocess.PIPE,
                         text=True, env=env)
    tmp = p.stdout.readline().strip()
    assert tmp and os.path.exists(tmp), f"the writer printed no temporary ({p.poll()})"
    return p, tmp


@pytest.mark.parametrize("kind", ["dir", "file"])
def test_next_writer_removes_temporaries_of_a_killed_writer_and_logs_it(tmp_path, kind, caplog):
    import signal
    target = tmp_path / "ckpt"
    alive, live_tmp = _start_writer(target, kind)        # a writer still running keeps its temporary
    killed, stale = _start_writer(target, kind)
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    try:
        assert os.path.exists(stale)
        writer = _io.atomic_dir if kind == "dir" else _io.atomic_file

        def write():
            with writer(target) as tmp:
                (tmp / "part").write_bytes(b"new") if kind == "dir" else tmp.write_bytes(b"new")

        with caplog.at_level("WARNING", logger="embedlab.io"):
            write()
        assert not os.path.exists(stale) and os.path.exists(live_tmp)
        assert f"removed {stale}, a temporary of {target} left by writer PID {killed.pid}" in caplog.text
        assert str(live_tmp) not in caplog.text
        other_node = tmp_path / f".ckpt.tmp-{killed.pid}.0@another-host-0123abcd"
        other_node.write_bytes(b"?")                      # another node's: its writer cannot be seen
        unrelated = tmp_path / f".other.tmp-{killed.pid}.0@{_io._node()}-0123abcd"
        unrelated.write_bytes(b"?")                       # another target's: left to that target's writer
        write()
        assert os.path.exists(live_tmp) and other_node.exists() and unrelated.exists()
    finally:
        alive.kill()
        alive.wait()


def test_a_reused_pid_or_a_zombie_counts_as_gone(tmp_path):
    me = os.getpid()
    started = _io._proc_stat(me)[1]
    assert not _io._writer_gone(me, started, _io._node())          # this very process
    assert _io._writer_gone(me, started + 1, _io._node())          # same PID, another process
    assert not _io._writer_gone(me, started + 1, "another-host")   # not ours to judge
    import subprocess
    import sys
    z = subprocess.Popen([sys.executable, "-c", "pass"])
    import time
    while _io._proc_stat(z.pid)[0] != "Z":                         # exited, not yet collected
        time.sleep(0.01)
    assert _io._writer_gone(z.pid, 0, _io._node())
    z.wait()


def test_previous_version_moved_aside_by_a_killed_writer_is_restored(tmp_path, caplog):
    target = tmp_path / "model"
    target.mkdir()
    (target / "w").write_text("old")
    # a writer killed between its two renames: the old version aside, the new one not yet in
    aside = tmp_path / f".model.old-999999999.0@{_io._node()}-0123abcd"
    new = tmp_path / f".model.tmp-999999999.0@{_io._node()}-89abcdef"
    os.replace(target, aside)
    new.mkdir()
    with caplog.at_level("WARNING", logger="embedlab.io"):
        assert sorted(_io.remove_stale_temporaries(target)) == sorted([aside, new])
    assert (target / "w").read_text() == "old" and _names(tmp_path) == ["model"]
    assert "restored" in caplog.text


def test_atomic_set_is_all_or_nothing(tmp_path, monkeypatch):
    a, b = tmp_path / "a.model", tmp_path / "b.model"
    a.write_text("a1")
    b.mkdir()
    (b / "key").write_text("b1")
    real_replace = os.replace

    def replace(src, dst):
        if str(dst) == str(b) and ".tmp-" in str(src):
            raise OSError(28, "No space left on device")   # the set's second rename fails
        return real_replace(src, dst)

    monkeypatch.setattr(_io.os, "replace", replace)
    with pytest.raises(OSError, match="No space"):
        with _io.atomic_set([a, b], fsync=True) as (ta, tb):
            ta.write_text("a2")
            tb.mkdir()
            (tb / "key").write_text("b2")
    assert a.read_text() == "a1" and (b / "key").read_text() == "b1"
    assert _names(tmp_path) == ["a.model", "b.model"]
    monkeypatch.setattr(_io.os, "replace", real_replace)
    with _io.atomic_set([a, b]) as (ta, tb):
        ta.write_text("a2")
        tb.mkdir()
        (tb / "key").write_text("b2")
    assert a.read_text() == "a2" and (b / "key").read_text() == "b2"
    assert _names(tmp_path) == ["a.model", "b.model"]
    with pytest.raises(FileNotFoundError, match="b.model: the block wrote nothing"):
        with _io.atomic_set([a, b]) as (ta, tb):
            ta.write_text("a3")
    assert a.read_text() == "a2" and _names(tmp_path) == ["a.model", "b.model"]
