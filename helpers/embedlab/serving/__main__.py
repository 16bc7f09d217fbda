"""`python -m embedlab.serving` (`make serve`): serve notebook 05's export until Ctrl-C.

The embedding is served through the HPS tiers embedding cache -> Redis -> RocksDB. The Redis is
the one named by EMBEDLAB_REDIS_ADDRESS (host:port) and EMBEDLAB_REDIS_PASSWORD when they are
set (docker/compose.yaml sets them for its Redis service); otherwise a local password-protected
redis-server is started on 127.0.0.1 and stopped with the server. RocksDB holds every row
(under <export>/serve/rocksdb), so lookups stay exact if Redis goes away. `--tiers export`
serves the export's own HPS JSON instead (in-process hash map, no Redis).

Writes the model repository next to the export (`<export>/repository`), starts tritonserver on
127.0.0.1 and prints how to query it. Ctrl-C (or SIGTERM) stops it by PID and removes what it
wrote under <export>/serve (the HPS JSON there holds the Redis password, mode 0600).

tritonserver and a local redis-server die with this process, even when it is killed. A
tritonserver that exits by itself (Triton's HTTP front end aborts on some malformed requests)
is restarted on the same ports, the reason printed, and counted in the metrics
(`embedlab_triton_restarts_total`); after 5 exits in 10 minutes it gives up. A tritonserver or
redis-server that an earlier, killed EmbedLab process left running is reported at start-up
with its PID and the command that stops it; one serving this repository stops the start.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import threading
from pathlib import Path


def main(argv=None) -> int:
    from embedlab import config
    from embedlab.services.redis_server import RedisSettingError, hps_redis
    from . import TritonServer, TritonServerError, load_manifest, write_model_repository, write_ps_config_variant
    default_export = config.DATA_DIR / "hps_triton"
    ap = argparse.ArgumentParser(prog="python -m embedlab.serving", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", type=Path, default=default_export,
                    help=f"folder holding serving.json (default: {default_export})")
    ap.add_argument("--repository", type=Path, default=None,
                    help="model repository to write (default: <export>/repository)")
    ap.add_argument("--tiers", choices=("redis", "export"), default="redis",
                    help="redis (default): cache -> Redis -> RocksDB, Redis from EMBEDLAB_REDIS_ADDRESS or a "
                         "local redis-server; export: the export's own HPS JSON (in-process hash map)")
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--max-batch-size", type=int, default=1024)
    args = ap.parse_args(argv)
    repo_dir = (args.repository or args.export / "repository").resolve()
    from embedlab.services import children
    from embedlab.services.redis_server import ADDRESS_ENV
    # A local redis-server's start reports the stale ones itself (hps_redis); with the user's
    # Redis none is started, so they are reported here.
    names = ("tritonserver", "redis-server") if os.environ.get(ADDRESS_ENV) else ("tritonserver",)
    for st in children.stale_servers(names):
        if st.name == "tritonserver" and f"--model-repository={repo_dir}" in st.cmdline:
            print(f"error: {children.describe(st)}; it serves {repo_dir}, which this start would rewrite",
                  file=sys.stderr)
            return 2
        print(f"warning: {children.describe(st)}", file=sys.stderr)
    try:
        manifest = load_manifest(args.export)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    redis, ps_config, tiers, serve_dir = None, None, "the export's HPS JSON (in-process tiers)", None
    if args.tiers == "redis":
        try:
            redis = hps_redis()
        except (RedisSettingError, FileNotFoundError, RuntimeError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        serve_dir = args.export / "serve"
        rocksdb = serve_dir / "rocksdb"
        # A fresh RocksDB: rows of an earlier export must not answer keys this one lacks.
        shutil.rmtree(rocksdb, ignore_errors=True)
        serve_dir.mkdir(parents=True, exist_ok=True)
        ps_config = write_ps_config_variant(
            manifest, serve_dir / "hps_serve.json",
            volatile_db=redis.volatile_db(initial_cache_rate=1.0, cache_missed_embeddings=True),
            persistent_db={"type": "rocks_db", "path": str(rocksdb.resolve())})
        tiers = f"embedding cache -> Redis -> RocksDB ({ps_config})\n  Redis   {redis.describe()}"
    try:
        repo = write_model_repository(manifest, repo_dir, max_batch_size=args.max_batch_size,
                                      ps_config_file=ps_config)
        server = TritonServer(repo, log_file=repo.parent / "triton.log", http_port=args.http_port,
                              grpc_port=args.grpc_port, metrics_port=args.metrics_port)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            server.start()
        except TritonServerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        k = manifest.keys_per_sample
        print(f"tritonserver pid {server.pid} is serving {repo}\n"
              f"  tiers   {tiers}\n"
              f"  HTTP    {server.http_url}   (curl {server.http_url}/v2/health/ready)\n"
              f"  gRPC    {server.grpc_url}\n"
              f"  metrics {server.metrics_url}   (embedlab_hps_stat: the HPS statistics, current at each scrape)\n"
              f"  log     {server.log_file}\n"
              f"Model 'ensemble': EMB_KEY int64 [batch, {k}], EMB_N_KEY int32 [batch, 1] (= {k}) -> "
              f"DENSE_OUTPUT float32, DEFAULTED_KEYS int32 [batch, 1] (keys answered with the default vector).\n"
              "  python -c \"import numpy as np; from embedlab.serving import client_for, predict; "
              f"print(predict(client_for('{server.http_url}'), np.zeros((2, {k}), np.int64)))\"\n"
              "Ctrl-C stops it.", flush=True)
        try:
            server.supervise(stop, report=lambda line: print(line, file=sys.stderr, flush=True))
        except TritonServerError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            pass
        finally:
            rc = server.stop()
            print(f"tritonserver stopped (status {rc})", flush=True)
        return 0
    finally:
        if redis is not None:
            redis.stop()      # a local redis-server started here; a user's Redis keeps running
        if serve_dir is not None:
            shutil.rmtree(serve_dir, ignore_errors=True)      # the JSON with the password, the RocksDB


if __name__ == "__main__":
    sys.exit(main())
