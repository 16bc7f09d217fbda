"""A worker of test_sok_checkpoint.py: dumps into a path under a regular file (every worker calls
sok.dump, rank 0 writes) and records, per rank, the error each worker raised."""
import json
import os
import sys


def main():
    outdir = sys.argv[1]
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import embedlab.sok as sok

    ctx = sok.init()
    v = sok.Variable(np.ones((8, 2), np.float32), name="t")
    blocker = os.path.join(outdir, "a_file")
    res = {"rank": ctx.rank}
    try:
        sok.dump(os.path.join(blocker, "sub", "ckpt"), [v])
        res["error"] = None
    except Exception as e:  # recorded for the test to check
        c = e.__cause__
        res.update(error=type(e).__name__, message=str(e), cause=type(c).__name__ if c else None,
                   cause_errno=getattr(c, "errno", None), cause_message=str(c) if c else None)
    with open(os.path.join(outdir, f"rank{ctx.rank}.json"), "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
