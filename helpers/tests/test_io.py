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
