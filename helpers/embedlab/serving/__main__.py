"""`python -m embedlab.serving` (`make serve`): serve notebook 05's export until Ctrl-C.

Writes the model repository next to the export (`<export>/repository`), starts tritonserver on
127.0.0.1 and prints how to query it. Ctrl-C (or SIGTERM) stops it by PID.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path


def main(argv=None) -> int:
    from embedlab import config
    from . import TritonServer, TritonServerError, load_manifest, write_model_repository
    default_export = config.DATA_DIR / "hps_triton"
    ap = argparse.ArgumentParser(prog="python -m embedlab.serving", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--export", type=Path, default=default_export,
                    help=f"folder holding serving.json (default: {default_export})")
    ap.add_argument("--repository", type=Path, default=None,
                    help="model repository to write (default: <export>/repository)")
    ap.add_argument("--http-port", type=int, default=8000)
    ap.add_argument("--grpc-port", type=int, default=8001)
    ap.add_argument("--metrics-port", type=int, default=8002)
    ap.add_argument("--max-batch-size", type=int, default=1024)
    args = ap.parse_args(argv)
    try:
        manifest = load_manifest(args.export)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    repo = write_model_repository(manifest, args.repository or args.export / "repository",
                                  max_batch_size=args.max_batch_size)
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
          f"  HTTP    {server.http_url}   (curl {server.http_url}/v2/health/ready)\n"
          f"  gRPC    {server.grpc_url}\n"
          f"  metrics {server.metrics_url}   (embedlab_hps_stat: the HPS statistics)\n"
          f"  log     {server.log_file}\n"
          f"Model 'ensemble': EMB_KEY int64 [batch, {k}], EMB_N_KEY int32 [batch, 1] (= {k}) -> "
          f"DENSE_OUTPUT float32.\n"
          "  python -c \"import numpy as np; from embedlab.serving import client_for, infer; "
          f"print(infer(client_for('{server.http_url}'), np.zeros((2, {k}), np.int64)))\"\n"
          "Ctrl-C stops it.", flush=True)
    try:
        while not stop.wait(0.5):
            if not server.running():
                print(f"tritonserver exited (status {server.process.returncode}); log: {server.log_file}",
                      file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        pass
    finally:
        rc = server.stop()
        print(f"tritonserver stopped (status {rc})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
