"""`python -m embedlab.serving` (what `make serve` runs), as a user runs it: with
EMBEDLAB_REDIS_ADDRESS / EMBEDLAB_REDIS_PASSWORD set it serves through that Redis (a
password-protected redis-server the test starts stands for the user's, e.g. compose's), without
them through a local redis-server it starts and stops; bad values stop it with an error naming
the variable. Real tritonserver, real Redis."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from embedlab.services.redis_server import ADDRESS_ENV, PASSWORD_ENV
from embedlab.serving import client_for, hps_stats, infer, predict
from serve_command import ServeCommand
from serving_export import SLOTS, VOCAB_PER_SLOT, random_keys, seal_export


def _copy_export(export_dir, dst):
    shutil.copytree(export_dir, dst)
    for p in dst.glob("*.json"):
        p.write_text(p.read_text().replace(str(export_dir), str(dst)))
    return seal_export(dst)


def _env(**kw):
    env = {k: v for k, v in os.environ.items() if k not in (ADDRESS_ENV, PASSWORD_ENV)}
    env.update(kw)
    return env


def _check_answers(out: str, reference, rng):
    url = re.search(r"HTTP\s+(127\.0\.0\.1:\d+)", out).group(1)
    metrics = re.search(r"metrics\s+(http://127\.0\.0\.1:\d+/metrics)", out).group(1)
    keys = random_keys(rng, 9)
    keys[3, 2] = 10**15
    stat = f"tables.{reference.manifest.model_name}/0.keys"
    before = hps_stats(metrics)[stat]
    with client_for(url) as c:
        got = infer(c, keys)
        p = predict(c, keys)            # the printed example's call
    np.testing.assert_allclose(got, reference.predict(keys), rtol=0, atol=1e-5)
    np.testing.assert_array_equal(p.output, got)
    np.testing.assert_array_equal(p.defaulted_keys, (keys >= SLOTS * VOCAB_PER_SLOT).sum(axis=1))
    assert hps_stats(metrics)[stat] - before == 2 * keys.size       # the metrics port is current


def test_serve_uses_the_redis_of_the_variables(export_dir, reference, tmp_path, rng):
    from embedlab.services.redis_server import start_redis
    exp = _copy_export(export_dir, tmp_path / "export")
    with start_redis() as users:
        s = ServeCommand(exp, tmp_path / "repo", _env(**{ADDRESS_ENV: users.address, PASSWORD_ENV: users.password}))
        try:
            out = s.until("Ctrl-C stops it.")
            assert f"the Redis at {users.address} named by {ADDRESS_ENV}" in out, out
            _check_answers(out, reference, rng)
            keys = users.client().keys(f"hps_et.{reference.manifest.model_name}.*")      # the rows are in that Redis
            assert sum(users.client().hlen(k) for k in keys) == \
                reference.ps.table_info(reference.manifest.model_name, 0)["rows"]
        finally:
            rc = s.stop(expect_stopped_line=True)
        assert rc == 0, "".join(s.lines)
        assert users.running and users.ping()           # the user's Redis is left running


def test_serve_without_the_variables_starts_and_stops_a_local_redis(export_dir, reference, tmp_path, rng):
    exp = _copy_export(export_dir, tmp_path / "export")
    s = ServeCommand(exp, tmp_path / "repo", _env())
    try:
        out = s.until("Ctrl-C stops it.")
        m = re.search(r"local redis-server started here \(pid (\d+)\) on (127\.0\.0\.1:\d+)", out)
        assert m, out
        pid = int(m.group(1))
        _check_answers(out, reference, rng)
    finally:
        rc = s.stop(expect_stopped_line=True)
    assert rc == 0, "".join(s.lines)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{pid}"), f"the local redis-server (pid {pid}) outlived make serve"


@pytest.mark.parametrize("bad", ["unreachable", "wrong_password"])
def test_serve_with_bad_variables_names_them(export_dir, tmp_path, bad):
    from embedlab.services.redis_server import start_redis
    with start_redis() as users:
        if bad == "unreachable":
            users.kill()
            env = _env(**{ADDRESS_ENV: users.address, PASSWORD_ENV: users.password})
            want = ADDRESS_ENV
        else:
            env = _env(**{ADDRESS_ENV: users.address, PASSWORD_ENV: "not-" + users.password})
            want = PASSWORD_ENV
        r = subprocess.run([sys.executable, "-m", "embedlab.serving", "--export", str(export_dir)],
                           capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert want in r.stderr and "error:" in r.stderr, r.stderr
    assert "tritonserver pid" not in r.stdout
