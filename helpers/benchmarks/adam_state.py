"""The fused Adam step on tables (and Adam's state) placed by EmbedLab against TensorFlow's buffers.

`embedlab.optimizers.Adam` trains T tables of R x D through `ops.fused_embedding_lookup` (lookup
backward + lazy Adam in one op), batch B, 1-3 uniform keys per row, sum, in a `tf.function` of K
steps (the ids are graph constants, a fresh batch per step); it prints (and with `--out` writes)
one JSON record: the median ms per step, how many tables and state tables start 2 MiB-aligned,
their addresses mod 4096, a digest of table 0 and its state (equal across the cases), and what
building Adam's state (zeros as large as the tables) took: seconds and the process's peak RSS
before and after it.
Run it once per case, alternating processes (docs/benchmarks/index.md, *Tables placed by EmbedLab*):

    .venv/bin/python helpers/benchmarks/adam_state.py                        # placed
    EMBEDLAB_ALIGNED_TABLES=0 .venv/bin/python helpers/benchmarks/adam_state.py   # TensorFlow's buffers
    .venv/bin/python helpers/benchmarks/adam_state.py --state keras          # tables placed, state not

`--state keras` removes `_SparseMixin.add_variable_from_reference` in its own process, so Keras
builds Adam's state in TensorFlow's buffers (as the optimizers did before they placed it).
"""
import argparse, hashlib, json, os, platform, resource, time
import numpy as np
from embedlab import import_tensorflow
tf = import_tensorflow()
from embedlab import ops, optimizers as eopt, tables as _tables  # noqa: E402
from embedlab._io import atomic_file  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--tables", type=int, default=26)
p.add_argument("--rows", type=int, default=250_000)
p.add_argument("--dim", type=int, default=64)
p.add_argument("--batch", type=int, default=4096)
p.add_argument("--steps-per-call", type=int, default=8)
p.add_argument("--repeats", type=int, default=15)
p.add_argument("--warmup", type=int, default=2)
p.add_argument("--out", default=None)
p.add_argument("--state", choices=["placed", "keras"], default="placed",
               help="keras: Adam's state built by Keras's own add_variable_from_reference (TensorFlow's buffers) "
                    "while the tables are placed")
a = p.parse_args()
T, R, D, B, K = a.tables, a.rows, a.dim, a.batch, a.steps_per_call
if a.state == "keras":
    del eopt._SparseMixin.add_variable_from_reference
rng = np.random.default_rng(0)
t0 = time.perf_counter()
tables = [tf.Variable(_tables.aligned(tf.random.stateless_uniform([R, D], [j, 1], -0.05, 0.05)), name=f"t{j}")
          for j in range(T)]
rss_tables_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t1 = time.perf_counter()
opt = eopt.Adam(0.001)
opt.build(tables)                    # Adam's m and v: zeros, as large as the tables
build_s = time.perf_counter() - t0
state_build_s = time.perf_counter() - t1
rss_state_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
batches = []
for k in range(K):
    ids = []
    for j in range(T):
        lens = rng.integers(1, 4, B)
        ids.append(tf.RaggedTensor.from_row_lengths(rng.integers(0, R, int(lens.sum())), lens))
    batches.append(ids)

@tf.function
def steps():
    for ids in batches:
        with tf.GradientTape() as tape:
            out = ops.fused_embedding_lookup(tables, ids, "sum")
            loss = tf.add_n([tf.reduce_sum(o) for o in out])
        opt.apply_gradients(zip(tape.gradient(loss, tables), tables))

for _ in range(a.warmup):
    steps()
times = []
for _ in range(a.repeats):
    t = time.perf_counter(); steps(); times.append((time.perf_counter() - t) * 1e3 / K)
mod = lambda v: _tables.address(v) % _tables.ALIGNMENT
slots = [s for t in tables for s in opt.slot_variables(t)]
fused = any(op.type == "EmbedLabFusedLookupGradApply" for op in steps.get_concrete_function().graph.get_operations())
h = hashlib.sha256()
for v in (tables[0], *opt.slot_variables(tables[0])):
    h.update(v.numpy().tobytes())
res = dict(state=a.state, script="helpers/benchmarks/adam_state.py", aligned_tables_env=os.environ.get("EMBEDLAB_ALIGNED_TABLES", ""),
           tables=T, rows=R, dim=D, batch=B, keys_per_row="1-3 uniform", steps_per_call=K, repeats=a.repeats,
           step_ms_median=float(np.median(times)), step_ms_min=float(np.min(times)), step_ms_all=[round(x, 3) for x in times],
           fused_backward_adam_op=fused, build_s=round(build_s, 1), state_build_s=round(state_build_s, 2),
           peak_rss_gib_after_tables=round(rss_tables_kib / 2**20, 2), peak_rss_gib_after_state=round(rss_state_kib / 2**20, 2),
           tables_placed=sum(mod(v) == 0 for v in tables), slots_placed=sum(mod(v) == 0 for v in slots), slots=len(slots),
           table_addr_mod_4096=sorted({_tables.address(v) % 4096 for v in tables + slots}),
           digest_table0_and_state=h.hexdigest()[:16], loadavg=os.getloadavg()[0],
           cpu=platform.processor() or platform.machine(), time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
print(json.dumps(res))
if a.out:
    with atomic_file(a.out) as tmp:
        tmp.write_text(json.dumps(res, indent=1))
