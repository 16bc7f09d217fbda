"""embedlab.services.redis_server: hps_redis() returns the Redis named by EMBEDLAB_REDIS_ADDRESS /
EMBEDLAB_REDIS_PASSWORD (a real password-protected redis-server the test starts on 127.0.0.1
stands for the user's), or starts a local one bound to loopback with a password; bad values give
errors naming the variable; a user's Redis is never killed or stopped."""
import socket

import pytest

from embedlab.services.redis_server import (ADDRESS_ENV, PASSWORD_ENV, RedisServer, RedisSettingError, hps_redis,
                                            redis_to_kill, start_redis)


@pytest.fixture
def redis_server():
    r = start_redis()
    yield r
    r.stop()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_users_redis_is_never_killed_or_stopped(users_redis_env):
    r = hps_redis()
    with pytest.raises(RuntimeError, match="refusing to kill"):
        r.kill()
    r.stop()
    assert users_redis_env.running and users_redis_env.ping()
    victim = redis_to_kill(r)
    try:
        assert isinstance(victim, RedisServer) and victim.address != users_redis_env.address
        victim.kill()
        assert not victim.running and users_redis_env.ping()
    finally:
        victim.stop()


def test_without_the_variables_a_local_redis_is_started(monkeypatch):
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    r = hps_redis()
    try:
        assert isinstance(r, RedisServer) and not r.external and r.running and r.password
        assert r.address.startswith("127.0.0.1:") and redis_to_kill(r) is r
        assert "local redis-server" in r.describe()
    finally:
        r.stop()
    assert not r.running


@pytest.mark.parametrize("case", ["unreachable", "wrong_password", "no_password", "malformed", "url",
                                  "password_without_address"])
def test_bad_values_name_the_variable(case, users_redis, monkeypatch):
    env = {ADDRESS_ENV: users_redis.address, PASSWORD_ENV: users_redis.password}
    want = {"unreachable": (ADDRESS_ENV, "cannot connect"), "wrong_password": (PASSWORD_ENV, "refused the password"),
            "no_password": (PASSWORD_ENV, "requires a password"), "malformed": (ADDRESS_ENV, "is not host:port"),
            "url": (ADDRESS_ENV, "is not host:port"), "password_without_address": (ADDRESS_ENV, "is not")}[case]
    if case == "unreachable":
        env[ADDRESS_ENV] = f"127.0.0.1:{_closed_port()}"
    elif case == "wrong_password":
        env[PASSWORD_ENV] = "not-the-password"
    elif case == "no_password":
        del env[PASSWORD_ENV]
    elif case == "malformed":
        env[ADDRESS_ENV] = "127.0.0.1"
    elif case == "url":
        env[ADDRESS_ENV] = f"redis://{users_redis.address}"
    else:
        del env[ADDRESS_ENV]
    for k in (ADDRESS_ENV, PASSWORD_ENV):
        monkeypatch.delenv(k, raising=False)
        if k in env:
            monkeypatch.setenv(k, env[k])
    with pytest.raises(RedisSettingError) as e:
        hps_redis()
    msg = str(e.value)
    assert want[0] in msg and want[1] in msg, msg
    assert users_redis.password not in msg and env.get(PASSWORD_ENV, users_redis.password) not in msg, msg


def test_local_redis_is_loopback_only_with_a_password(redis_server):
    c = redis_server.client()
    assert c.config_get("bind")["bind"] == "127.0.0.1"
    assert c.config_get("requirepass")["requirepass"] == redis_server.password != ""
    assert c.config_get("save")["save"] == "" and c.config_get("appendonly")["appendonly"] == "no"
    import redis
    with pytest.raises(redis.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=redis_server.port, password="not-it").ping()


# ---- a local redis-server dies with its owner -------------------------------------------------------

def _owner(code: str):
    """A Python process running `code` (it prints the redis-server's pid and folder), in its own session."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for k in (ADDRESS_ENV, PASSWORD_ENV):
        env.pop(k, None)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)


_START = ("import time\nfrom embedlab.services import hps_redis\nr = hps_redis()\n"
          "print(r.proc.pid, r.dir, flush=True)\n")


def _gone_within(pid: int, seconds: float) -> bool:
    import time
    import psutil
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_redis_dies_with_its_owner_killed(caplog):
    import os
    import signal
    from pathlib import Path
    p = _owner(_START + "time.sleep(600)\n")
    line = p.stdout.readline().split()
    assert line, p.stderr.read()
    pid, folder = int(line[0]), Path(line[1])
    try:
        assert _gone_within(pid, 0.5) is False                 # running while its owner runs
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        assert _gone_within(pid, 5.0), f"redis-server (pid {pid}) outlived its SIGKILLed owner"
    finally:
        if not _gone_within(pid, 0):
            os.kill(pid, signal.SIGKILL)
    assert folder.is_dir()                                     # a SIGKILLed owner cannot remove it ...
    with caplog.at_level("WARNING", logger="embedlab.services"):
        start_redis().stop()                                   # ... the next local server's start does
    assert not folder.exists() and str(folder) in caplog.text


def test_redis_stops_when_its_owner_raises():
    from pathlib import Path
    p = _owner(_START + "raise RuntimeError('the script failed after starting Redis')\n")
    out, err = p.communicate(timeout=60)
    assert p.returncode == 1 and "the script failed" in err
    pid, folder = int(out.split()[0]), Path(out.split()[1])
    gone = _gone_within(pid, 5.0)
    if not gone:
        import os
        import signal
        os.kill(pid, signal.SIGKILL)
    assert gone, f"redis-server (pid {pid}) outlived its owner's exception"
    assert not folder.exists()


def test_a_stale_redis_is_reported_with_the_command_that_stops_it(caplog):
    """A redis-server of ours whose owner is gone (started without the parent-death signal, as
    before this rule) is reported with its PID and `kill <pid>`."""
    import os
    import signal
    from embedlab.services import children
    port = _closed_port()
    code = ("import os, subprocess, shutil\nfrom embedlab.services import children, redis_server\n"
            "d = redis_server._owned_tempdir('embedlab-redis-')\n"
            f"p = subprocess.Popen([shutil.which('redis-server'), '--port', '{port}', '--bind', '127.0.0.1', "
            "'--save', '', '--dir', str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, "
            "start_new_session=True)\nprint(p.pid, flush=True)\n")
    p = _owner(code)
    out, err = p.communicate(timeout=60)
    pid = int(out.split()[0])
    try:
        with caplog.at_level("WARNING", logger="embedlab.services"):
            stale = children.stale_servers(("redis-server",))
            r = start_redis()
            r.stop()
        assert pid in [s.pid for s in stale]
        assert f"pid {pid}" in caplog.text and f"`kill {pid}`" in caplog.text, caplog.text
    finally:
        os.kill(pid, signal.SIGKILL)
        _gone_within(pid, 5.0)
        children_left = [s.pid for s in children.stale_servers(("redis-server",))]
        assert pid not in children_left
        from embedlab.services import report_stale_redis
        report_stale_redis()                                   # removes its folder


def test_the_config_holding_the_password_is_private(redis_server):
    import stat
    conf = redis_server.dir / f"redis-{redis_server.port}.conf"
    assert redis_server.password in conf.read_text()
    assert stat.S_IMODE(conf.stat().st_mode) == 0o600
