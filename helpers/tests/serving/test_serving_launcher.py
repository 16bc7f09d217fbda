"""The launcher: start, serve, stop by PID; failures at start-up give a clear error and leave no
process behind; the manifest and repository writers refuse bad input."""
from __future__ import annotations

import json
import os
import shutil
import socket
import stat

import numpy as np
import pytest

import embedlab.serving.server as server_mod
from embedlab.serving import (IDENTITY_ENSEMBLE, TritonServer, TritonServerError, client_for,
                              find_tritonserver, infer, load_manifest, write_identity_repository,
                              write_model_repository)
from serving_export import MAX_BATCH, SLOTS, random_keys, seal_export


def _gone(server: TritonServer) -> bool:
    """The server process and every process of its group have exited."""
    if server.process is None:
        return True
    if server.process.poll() is None:
        return False
    return not server_mod._group_alive(server.process.pid)


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_find_binary():
    inst = find_tritonserver()
    assert inst.binary.is_file() and os.access(inst.binary, os.X_OK)
    assert inst.stub.name == "triton_python_backend_stub"


def test_identity_ensemble_start_infer_stop(tmp_path, rng):
    repo = write_identity_repository(tmp_path / "identity", keys_per_sample=SLOTS, max_batch_size=MAX_BATCH)
    s = TritonServer(repo, log_file=tmp_path / "identity.log")
    with s:
        # start() returns once every endpoint answers, the metrics one included (tritonserver
        # opens it after HTTP).
        assert s.running() and _port_open(s.http_port) and _port_open(s.grpc_port)
        assert _port_open(s.metrics_port)
        keys = random_keys(rng, 5)
        for protocol in ("http", "grpc"):
            with client_for(s, protocol) as c:
                out = infer(c, keys, model=IDENTITY_ENSEMBLE, output="OUTPUT", numkeys_name=None)
            np.testing.assert_array_equal(out, keys)
        pid, http_port = s.pid, s.http_port
    assert _gone(s), f"tritonserver (pid {pid}) or one of its stubs is still running"
    assert not _port_open(http_port)
    assert s.process.returncode == 0, s.log()[-2000:]
    assert "successfully loaded 'identity_a'" in (tmp_path / "identity.log").read_text()
    s.stop()   # idempotent


def _copy_export(export_dir, dst):
    shutil.copytree(export_dir, dst)
    # re-point the manifest and HPS JSON at the copy
    for name in ("serving.json", *(p.name for p in dst.glob("*.json") if p.name != "serving.json")):
        p = dst / name
        p.write_text(p.read_text().replace(str(export_dir), str(dst)))
    return seal_export(dst)


def test_corrupt_onnx_at_startup_is_named_and_nothing_left(export_dir, tmp_path):
    exp = _copy_export(export_dir, tmp_path / "export")
    repo = write_model_repository(exp, tmp_path / "repo", max_batch_size=MAX_BATCH)
    onnx_file = exp / "dense.onnx"
    onnx_file.write_bytes(onnx_file.read_bytes()[:100])       # truncated after the repository was written
    s = TritonServer(repo, log_file=tmp_path / "t.log", ready_timeout_s=60)
    with pytest.raises(TritonServerError) as e:
        s.start()
    msg = str(e.value)
    assert "dense" in msg and "dense.onnx" in msg and "t.log" in msg, msg
    assert _gone(s)


def test_missing_sparse_file_at_startup_is_named_and_nothing_left(export_dir, tmp_path):
    exp = _copy_export(export_dir, tmp_path / "export")
    repo = write_model_repository(exp, tmp_path / "repo", max_batch_size=MAX_BATCH)
    m = load_manifest(exp)
    sparse = json.loads(open(m.ps_config_file).read())["models"][0]["sparse_files"][0]
    os.remove(os.path.join(sparse, "emb_vector"))
    s = TritonServer(repo, log_file=tmp_path / "t.log", ready_timeout_s=60)
    with pytest.raises(TritonServerError) as e:
        s.start()
    msg = str(e.value)
    assert "hps_embedding" in msg and "emb_vector" in msg, msg
    assert _gone(s)


def test_binary_that_cannot_run_says_why(tmp_path, monkeypatch, repository):
    # A stand-in binary that fails the way a missing vendored library does.
    real = find_tritonserver()
    fake = tmp_path / "tritonserver"
    fake.write_text("#!/bin/sh\necho 'tritonserver: error while loading shared libraries: "
                    "libb64.so.0d: cannot open shared object file: No such file or directory' >&2\nexit 127\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setattr(server_mod, "find_tritonserver", lambda: real.__class__(
        real.root, fake, real.python_backend, real.stub, real.libs))
    s = TritonServer(repository, log_file=tmp_path / "t.log")
    with pytest.raises(TritonServerError, match=r"(?s)exited with status 127.*libb64.*LD_LIBRARY_PATH"):
        s.start()
    assert _gone(s)


def test_numpy_2_is_refused(monkeypatch, repository):
    monkeypatch.setattr(np, "__version__", "2.1.0")
    with pytest.raises(TritonServerError, match=r"numpy 2.1.0 .*numpy < 2"):
        TritonServer(repository).start()


def test_missing_repository(tmp_path):
    with pytest.raises(TritonServerError, match="does not exist"):
        TritonServer(tmp_path / "nope").start()


def test_manifest_errors(export_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="run notebook 05"):
        load_manifest(tmp_path)
    raw = json.loads((export_dir / "serving.json").read_text())
    for field, value, match in [("emb_vec_size", None, "field 'emb_vec_size' is missing"),
                                ("table_id", "0", "table_id"),
                                ("onnx_file", str(tmp_path / "x.onnx"), "onnx_file .* does not exist")]:
        bad = dict(raw)
        if value is None:
            del bad[field]
        else:
            bad[field] = value
        (tmp_path / "serving.json").write_text(json.dumps(bad))
        with pytest.raises((ValueError, FileNotFoundError), match=match):
            load_manifest(tmp_path)


def test_repository_writer_refuses_bad_onnx_output(export_dir, tmp_path):
    m = load_manifest(export_dir)
    bad = m.__class__(**{**m.__dict__, "onnx_output": "nope"})
    with pytest.raises(ValueError, match="has no output 'nope'"):
        write_model_repository(bad, tmp_path / "repo")
    assert not (tmp_path / "repo").exists()


def test_table_dim_disagreeing_with_manifest_is_named(export_dir, tmp_path):
    exp = _copy_export(export_dir, tmp_path / "export")
    raw = json.loads((exp / "serving.json").read_text())
    raw["emb_vec_size"] = raw["emb_vec_size"] // 2
    (exp / "serving.json").write_text(json.dumps(raw))
    repo = write_model_repository(exp, tmp_path / "repo", max_batch_size=MAX_BATCH)
    s = TritonServer(repo, log_file=tmp_path / "t.log", ready_timeout_s=60)
    with pytest.raises(TritonServerError, match=r"(?s)model 'hps_embedding' failed to load.*has dim \d+, "
                                                r"but config.pbtxt says emb_vec_size"):
        s.start()
    assert _gone(s)

