"""Turn the benchmark JSON of docs/benchmarks/results/ into the tables and plots of the benchmarks page.

The documentation build runs it (docs/conf.py, at start) and docs/benchmarks/index.md includes what it writes: per
benchmark, `<name>.md` (a table of the runs: machine, CPU or GPU, date, commit, file; then the results) and
`<name>.png` (matplotlib, Agg). Every number on the page comes from the JSON through this script; the page's prose
explains the method only. A file named in RUNS that is missing, or a field a table needs that a file lacks, is an
error naming the file.

    python docs/benchmarks/generate.py --out docs/benchmarks/_generated
"""
from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPO = HERE.parents[1]

# The files each section cites: the newest run of the current code per machine (see index.md, "Which runs").
RUNS = {
    "lookup_cpu": ["lookup_cpu_amd-epyc-2c_2026-11-28T0014Z_zen4_prefetch-auto.json",
                   "lookup_cpu_amd-epyc-2c_2026-11-28T0013Z_zen4_prefetch-auto.json",
                   "lookup_cpu_amd-epyc-2c_2026-11-23T0052Z.json",
                   "lookup_cpu_amd-epyc-2c_2026-11-23T0008Z.json",
                   "lookup_cpu_amd-epyc-2c_2026-11-23T0012Z.json"],
    "gather_floor": ["gather_floor_amd-epyc-2c_2026-11-28T0015Z_zen4_prefetch-auto.txt"],
    "lookup_cpu_alignment": ["lookup_cpu_alignment_amd-epyc-2c_2026-11-25T0759Z_tf_d16_k8.json",
                             "lookup_cpu_alignment_amd-epyc-2c_2026-11-25T0759Z_tf_d64_k8.json"],
    "adam_state": ["adam_state_amd-epyc-2c_2026-11-27T231042Z_placed.json"],
    "lookup_gpu": ["lookup_gpu_forward_nvidia-h100_2026-11-28T0217Z.json",
                   "lookup_gpu_forward_nvidia-h200_2026-11-28T0213Z.json",
                   "lookup_gpu_nvidia-h100_2026-11-23T1657Z.json"],
    "loader": ["loader_intel-xeon-2c_2026-11-22T0024Z.json"],
    "etl": ["etl_amd-epyc-2c_2026-11-25T0515Z.json"],
    "hash_table": ["hash_table_amd-epyc-2c_2026-11-23T1319Z.json"],
    "hps": ["hps_amd-epyc-2c_2026-11-23T1441Z.json", "hps_amd-epyc-2c_2026-11-23T1808Z.json"],
    "hps_db": ["hps_db_amd-epyc-2c_2026-11-23T1808Z.json"],
    "hps_gpu": ["hps_gpu_nvidia-h100_2026-11-28T0216Z.json", "hps_gpu_nvidia-h200_2026-11-28T0212Z.json"],
    "hps_server_gpu": ["hps_server_gpu_nvidia-h200_2026-11-28T1001Z.json"],
    "sparse_optimizers_gpu": ["sparse_optimizers_gpu_nvidia-h200_2026-11-28T0940Z.json"],
    "serving": ["serving_amd-epyc-2c_2026-11-23T1443Z.json"],
    "session": ["session_amd-epyc-2c_2026-11-23T1907Z.json", "session_oversub_amd-epyc-2c_2026-11-23T1908Z.json"],
    "sok": ["sok_amd-epyc-2c_2026-11-23.json", "sok_2workers_amd-epyc-2c_2026-11-23.json",
            "sok_gpu_routing_nvidia-h100_2026-11-28T0216Z.json", "sok_gpu_routing_nvidia-h200_2026-11-28T0212Z.json"],
    "plugin_layer": ["plugin_layer_intel-xeon-2c_2026-11-28T0843Z.json"],
    "keras_rs": ["keras_rs_intel-xeon-2c_2026-11-28T1012Z.json", "keras_rs_intel-xeon-2c_2026-11-28T1014Z.json",
                 "keras_rs_intel-xeon-2c_2026-11-28T1013Z.json"],
}

PEER = "#7f7f7f"      # peers and baselines: grey
FLOOR = "#d62728"     # floors: red
OURS = "#1f77b4"      # EmbedLab: blue
OURS2 = "#17becf"


# ----------------------------------------------------------------------------------------------------------------
# Reading the files

def load(name: str):
    path = RESULTS / name
    if not path.is_file():
        raise FileNotFoundError(f"benchmark result {path} is cited by generate.py RUNS but missing")
    return json.loads(path.read_text()) if path.suffix == ".json" else path.read_text()


def field(d: dict, *keys, file: str = ""):
    """d[k0][k1]...; a missing key is an error naming the file and the key."""
    cur = d
    for k in keys:
        if not isinstance(cur, dict) or k not in cur:
            raise KeyError(f"{file}: no field {'.'.join(map(str, keys))} (missing {k!r})")
        cur = cur[k]
    return cur


def run_date(name: str, d) -> str:
    """The run's UTC date from the file's own fields, else from its name's stamp."""
    if isinstance(d, dict):
        for k in ("date", "date_utc", "time_utc", "time"):
            v = d.get(k)
            if isinstance(v, str) and re.match(r"\d{4}-\d\d-\d\d", v):
                return v[:16].replace("T", " ")
    m = re.search(r"_(\d{4}-\d\d-\d\d)(?:T(\d\d)(\d\d))?", name)
    if not m:
        raise ValueError(f"{name}: no date in the file or its name")
    return m.group(1) + (f" {m.group(2)}:{m.group(3)}" if m.group(2) else "")


def run_commit(name: str) -> str:
    """The commit that recorded the file (git, following its moves); '-' outside a git checkout."""
    # The folder the benchmark scripts wrote to before this page existed is asked too, for files not yet
    # committed at their present path.
    for path in (RESULTS / name, REPO / "helpers" / "benchmarks" / "results" / name):
        try:
            out = subprocess.run(["git", "log", "--follow", "--diff-filter=A", "--format=%h", "-1", "--", str(path)],
                                 cwd=REPO, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return "-"
        if out.stdout.strip():
            return out.stdout.strip()
    return "-"


def hardware(name: str, d) -> tuple[str, str]:
    """(machine slug, CPU or GPU model) of a run, from the file's own fields."""
    slug = re.match(r"[a-z_0-9]+?_((?:amd|intel|nvidia)-[a-z0-9]+(?:-2c)?)_", name)
    machine = slug.group(1) if slug else "?"
    if isinstance(d, str):
        return machine, "AMD EPYC (family 25 model 17)" if "zen4" in name else machine
    info = d.get("info") or {}
    if info.get("gpu"):
        return machine, info["gpu"]
    if d.get("device"):
        return machine, d["device"]
    m = d.get("machine") if isinstance(d.get("machine"), dict) else {}
    if m.get("gpu"):
        return machine, m["gpu"]
    cpu = m.get("cpu") or d.get("cpu") or ""
    if cpu in ("", "x86_64"):
        cpu = {"amd-epyc-2c": "AMD EPYC", "intel-xeon-2c": "Intel Xeon"}.get(machine, cpu or machine)
    if m.get("cpu_family_model"):
        cpu += f" ({m['cpu_family_model']})"
    cores = m.get("cores") or d.get("cores") or d.get("cpus")
    return machine, f"{cpu}, {cores} cores" if cores else cpu


# ----------------------------------------------------------------------------------------------------------------
# Writing tables and plots

def num(v, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (int,)) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.{digits}f}"
    return str(v)


def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def runs_table(names: list[str]) -> str:
    rows = []
    for n in names:
        d = load(n)
        machine, hw = hardware(n, d)
        rows.append([f"`{machine}`", hw, run_date(n, d), f"`{run_commit(n)}`", f"`{n}`"])
    return table(["machine", "CPU / GPU", "date (UTC)", "commit", "file (docs/benchmarks/results/)"], rows)


def bars(ax, groups: list[str], series: list[tuple[str, list, str]], ylabel: str):
    """Grouped bars: series = [(label, values per group, colour)]."""
    width = 0.8 / max(1, len(series))
    for i, (label, values, colour) in enumerate(series):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        ax.bar(xs, [v if v is not None and not (isinstance(v, float) and math.isnan(v)) else 0 for v in values],
               width, label=label, color=colour)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)


def save(fig, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    plt.close(fig)
    return f"\n![{name}: generated from the JSON above]({name}.png)\n"


# ----------------------------------------------------------------------------------------------------------------
# One function per section: returns the Markdown that index.md includes, and writes the plot

def gather_floor_ms(text: str) -> dict[int, float]:
    """dim -> the plain read's median ms (the 'floor:' line of each block of gather_floor's output)."""
    floors, dim = {}, None
    for line in text.splitlines():
        m = re.match(r"26 tables x \d+ rows x (\d+) floats", line)
        if m:
            dim = int(m.group(1))
        m = re.match(r"floor: .*median ([\d.]+) ms", line)
        if m and dim is not None:
            floors[dim] = float(m.group(1))
    return floors


def sec_lookup_cpu(out: Path) -> str:
    names = RUNS["lookup_cpu"]
    peers = [p for n in names for p in load(n).get("peers", [])]
    floors = gather_floor_ms(load(RUNS["gather_floor"][0]))
    rows = []
    for p in sorted(peers, key=lambda p: p["peer_dim"]):
        dim = p["peer_dim"]
        rows.append([dim, num(p["peer_fwd_torch_ms"]), num(p["peer_fwd_core_ms"]), num(p.get("peer_fwd_graph_ms")),
                     num(floors.get(dim)), f"**{num(p['peer_fwd_ratio_core'])}x**", num(p.get("peer_fwd_ratio_graph")),
                     num(p["peer_step_torch_ms"]), num(p["peer_step_core_ms"]), num(p.get("peer_step_graph_ms")),
                     f"**{num(p['peer_step_ratio_core'])}x**", num(p.get("peer_step_ratio_graph"))])
    md = "**Against torch's `EmbeddingBag`** (`make bench-peers`), medians in ms:\n\n" + table(
        ["dim", "fwd torch", "fwd core", "fwd in graph", "plain-read floor", "fwd ratio core", "fwd ratio graph",
         "step torch", "step core", "step in graph", "step ratio core", "step ratio graph"], rows)
    tf_rows = []
    for n in names:
        for r in load(n)["results"]:
            tf_rows.append([r["dim"], num(r["graph_fwd_native_ms"]), num(r["graph_fwd_embedlab_ms"]),
                            num(r["graph_fwd_embedlab_csr_ms"]), f"**{num(r['graph_fwd_ratio'])}x**",
                            num(r["graph_step_native_ms"]), num(r["graph_step_embedlab_ms"]),
                            f"**{num(r['graph_step_ratio'])}x**"])
    md += ("\n**Against TensorFlow** (`tf.nn.safe_embedding_lookup_sparse` and Keras SGD, in a `tf.function` of 8 steps),"
           " ms per step:\n\n" + table(["dim", "fwd TF", "fwd EmbedLab (COO)", "fwd EmbedLab (CSR)", "fwd ratio",
                                       "step TF", "step EmbedLab", "step ratio"], sorted(tf_rows)))
    dims = sorted({p["peer_dim"] for p in peers})
    by = {p["peer_dim"]: p for p in peers}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    bars(axes[0], [f"dim {d}" for d in dims], [
        ("torch EmbeddingBag (peer)", [by[d]["peer_fwd_torch_ms"] for d in dims], PEER),
        ("EmbedLab core", [by[d]["peer_fwd_core_ms"] for d in dims], OURS),
        ("EmbedLab op in graph", [by[d].get("peer_fwd_graph_ms") for d in dims], OURS2),
        ("gather_floor plain read (floor)", [floors.get(d) for d in dims], FLOOR)], "forward, ms")
    bars(axes[1], [f"dim {d}" for d in dims], [
        ("torch EmbeddingBag + SGD (peer)", [by[d]["peer_step_torch_ms"] for d in dims], PEER),
        ("EmbedLab core", [by[d]["peer_step_core_ms"] for d in dims], OURS),
        ("EmbedLab op in graph", [by[d].get("peer_step_graph_ms") for d in dims], OURS2)], "train step, ms")
    fig.suptitle("26 tables x 1M rows, batch 4,096, 1-3 keys per row (lower is better)", fontsize=10)
    return runs_table(names + RUNS["gather_floor"]) + "\n" + md + save(fig, out, "lookup_cpu")


def sec_gather_floor(out: Path) -> str:
    text = load(RUNS["gather_floor"][0])
    rows, dim = [], None
    for line in text.splitlines():
        m = re.match(r"26 tables x \d+ rows x (\d+) floats", line)
        if m:
            dim = int(m.group(1))
        m = re.match(r"(lookup_forward_cpu.*?|plain gather.*?|floor: .*?):?\s+median ([\d.]+) ms", line)
        if m and dim is not None:
            rows.append([dim, m.group(1).rstrip(":, "), m.group(2)])
    md = table(["dim", "what", "median ms"], rows)
    floors = gather_floor_ms(text)
    fwd = {}
    dim = None
    for line in text.splitlines():
        m = re.match(r"26 tables x \d+ rows x (\d+) floats", line)
        if m:
            dim = int(m.group(1))
        m = re.match(r"lookup_forward_cpu.*median ([\d.]+) ms", line)
        if m:
            fwd[dim] = float(m.group(1))
    dims = sorted(floors)
    fig, ax = plt.subplots(figsize=(6, 3.4))
    bars(ax, [f"dim {d}" for d in dims], [("EmbedLab forward kernel", [fwd.get(d) for d in dims], OURS),
                                          ("plain read (floor)", [floors[d] for d in dims], FLOOR)], "ms per batch")
    ax.set_title("forward kernel against the plain read of the same rows", fontsize=10)
    return runs_table(RUNS["gather_floor"]) + "\n" + md + save(fig, out, "gather_floor")


def sec_lookup_cpu_alignment(out: Path) -> str:
    names = RUNS["lookup_cpu_alignment"]
    rows, labels, series = [], [], {}
    for n in names:
        d = load(n)
        med = field(d, "median_ms", file=n)
        for k, v in med.items():
            rows.append([d["dim"], k.removesuffix("_ms").replace("_", " "), num(v)])
            series.setdefault(k, {})[d["dim"]] = v
        labels.append(d["dim"])
    md = table(["dim", "case", "median ms"], rows)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    colours = [OURS, OURS2, "#2ca02c", "#9467bd", "#8c564b", PEER]
    bars(ax, [f"dim {d}" for d in labels], [(k.removesuffix("_ms").replace("_", " "), [v.get(d) for d in labels],
                                             colours[i % len(colours)]) for i, (k, v) in enumerate(series.items())],
         "forward, ms")
    return runs_table(names) + "\n" + md + save(fig, out, "lookup_cpu_alignment")


def sec_adam_state(out: Path) -> str:
    names = RUNS["adam_state"]
    rows = []
    for n in names:
        d = load(n)
        rows.append([d["tables"], f"{d['rows']:,} x {d['dim']}", d["batch"], d["steps_per_call"], num(d["step_ms_median"]),
                     num(d["step_ms_min"]), d["tables_placed"], d["slots_placed"], num(d["peak_rss_gib_after_state"])])
    md = table(["tables", "rows x dim", "batch", "steps per call", "step ms (median)", "step ms (min)",
                "tables placed", "Adam slots placed", "peak RSS GiB"], rows)
    d = load(names[0])
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.plot(range(1, len(d["step_ms_all"]) + 1), d["step_ms_all"], "o-", color=OURS, label="EmbedLab Adam step")
    ax.axhline(d["step_ms_median"], color=PEER, ls="--", label="median")
    ax.set_xlabel("repeat"), ax.set_ylabel("ms per step"), ax.legend(fontsize=8)
    return runs_table(names) + "\n" + md + save(fig, out, "adam_state")


def sec_lookup_gpu(out: Path) -> str:
    names = RUNS["lookup_gpu"]
    rows, plot = [], {}
    for n in names:
        d = load(n)
        gpu = d["info"]["gpu"].replace("NVIDIA ", "")
        for r in d["rows"]:
            if r["op"].startswith("exp:") or "spread" in r["op"] or r.get("dist", "uniform") != "uniform":
                continue
            rows.append([gpu, n.split("_nvidia")[0].replace("lookup_gpu", "all") if "forward" not in n else "forward",
                         r["workload"], r["op"], num(r["ours_ms"], 3), num(r.get("torch_ms"), 3),
                         num(r.get("speedup")), num(r.get("ours_frac_copy")), num(r.get("of_floor"))])
            if r["op"] == "forward-sum" and "forward" in n:
                plot.setdefault(gpu, {})[r["workload"]] = r
    md = table(["GPU", "run", "workload", "op", "EmbedLab ms", "PyTorch ms", "ratio", "of device copy",
                "of gather floor"], rows)
    fig, axes = plt.subplots(1, len(plot), figsize=(5 * len(plot), 3.4), squeeze=False)
    for ax, (gpu, wl) in zip(axes[0], sorted(plot.items())):
        ks = sorted(wl)
        bars(ax, ks, [("PyTorch embedding_bag (peer)", [wl[k]["torch_ms"] for k in ks], PEER),
                      ("EmbedLab forward", [wl[k]["ours_ms"] for k in ks], OURS),
                      ("plain gather of the same rows (floor)", [wl[k].get("floor_ms") for k in ks], FLOOR)],
             "forward, ms")
        ax.set_title(gpu, fontsize=10)
    return runs_table(names) + "\n" + md + save(fig, out, "lookup_gpu")


def sec_loader(out: Path) -> str:
    names = RUNS["loader"]
    d = load(names[0])
    cases = [("ParquetLoader, shuffled", "loader_rows_per_s", OURS), ("ParquetLoader, not shuffled",
             "loader_noshuffle_rows_per_s", OURS2), ("ParquetLoader through tf.data", "loader_tfdata_rows_per_s", OURS2),
             ("TFRecord + parse_example, shuffled (peer)", "tfrecord_shuffle_rows_per_s", PEER),
             ("TFRecord + parse_example (peer)", "tfrecord_rows_per_s", PEER),
             ("tf.data item by item, shuffled (peer)", "items_shuffle_rows_per_s", PEER),
             ("tf.data item by item (peer)", "items_rows_per_s", PEER)]
    md = table(["pipeline", "rows/s"], [[c, num(field(d, k, file=names[0]), 0)] for c, k, _ in cases])
    md = f"{d['rows']:,} rows, batch {d['batch_size']:,}.\n\n" + md
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.barh([c for c, _, _ in cases][::-1], [d[k] / 1e6 for _, k, _ in cases][::-1], color=[c for *_, c in cases][::-1])
    ax.set_xlabel("M rows/s (higher is better)")
    return runs_table(names) + "\n" + md + save(fig, out, "loader")


def sec_etl(out: Path) -> str:
    names = RUNS["etl"]
    d = load(names[0])
    label = {"single": "one process", "single_1core": "one process, one core", "dask1": "Dask, 1 worker",
             "dask2": "Dask, 2 workers"}
    rows = []
    for k, r in d["runs"].items():
        rss = r.get("worker_peak_rss") or [r.get("peak_rss")]
        rows.append([label.get(k, k), num(r["seconds"]), num(d["rows"] / r["seconds"], 0),
                     num(max(x for x in rss if x) / 2**30) if any(rss) else "-"])
    md = (f"{d['rows']:,} generated lines ({d['input_bytes'] / 1e6:,.0f} MB), chunks of {d['chunk_bytes'] >> 20} MiB.\n\n"
          + table(["run", "seconds", "rows/s", "peak RSS GiB (a worker)"], rows))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ks = list(d["runs"])
    ax.bar([label.get(k, k) for k in ks], [d["runs"][k]["seconds"] for k in ks],
           color=[PEER if k.startswith("single") else OURS for k in ks])
    ax.set_ylabel("seconds (lower is better)")
    ax.tick_params(axis="x", labelsize=8)
    return runs_table(names) + "\n" + md + save(fig, out, "etl")


def sec_hash_table(out: Path) -> str:
    names = RUNS["hash_table"]
    d = load(names[0])
    res = [r for r in d["results"] if r["op"] == "find"]
    rows = [[f"{r['size']:,}", r["dist"], r["impl"], num(r["mkeys_per_s"]), num(r.get("embedlab_speedup"))]
            for r in res]
    md = table(["size", "keys", "implementation", "M keys/s", "EmbedLab's speedup"], rows)
    fig, ax = plt.subplots(figsize=(8, 3.4))
    groups = sorted({(r["size"], r["dist"]) for r in res})
    impls = list(dict.fromkeys(r["impl"] for r in res))
    val = {(r["size"], r["dist"], r["impl"]): r["mkeys_per_s"] for r in res}
    bars(ax, [f"{s // 10**6}M, {dist}" for s, dist in groups],
         [(i + ("" if i.startswith("embedlab") else " (peer)"), [val.get((s, dist, i)) for s, dist in groups],
           OURS if i == "embedlab" else (OURS2 if i.startswith("embedlab") else PEER)) for i in impls],
         "find, M keys/s (higher is better)")
    return runs_table(names) + "\n" + md + save(fig, out, "hash_table")


def sec_hps(out: Path) -> str:
    names = RUNS["hps"]
    rows, plot = [], {}
    for n in names:
        for r in load(n)["rows"]:
            rows.append([r["tier"], r["impl"], r["dim"], r["dist"], num(r["ms"]), num(r["mkeys_per_s"])])
            if r["dist"] == "uniform":
                plot.setdefault(r["dim"], {})[r["impl"]] = r["mkeys_per_s"]
    md = table(["tier", "implementation", "dim", "keys", "ms per batch", "M keys/s"], rows)
    dims = sorted(plot)
    impls = list(dict.fromkeys(i for d in dims for i in plot[d]))
    fig, ax = plt.subplots(figsize=(9, 3.6))
    bars(ax, [f"dim {d}" for d in dims],
         [(i + (" (baseline)" if "np." in i or "dict" in i else ""), [plot[d].get(i) for d in dims],
           PEER if ("np." in i or "dict" in i) else plt.cm.tab10(k % 10)) for k, i in enumerate(impls)],
         "M keys/s, uniform keys (higher is better)")
    return runs_table(names) + "\n" + md + save(fig, out, "hps")


def sec_hps_db(out: Path) -> str:
    names = RUNS["hps_db"]
    res = load(names[0])["results"]
    rows = [[r["dim"], r["dist"], f"{r['rows']:,}", num(r["redis_tier_keys_s"] / 1e6), num(r["redis_benchmark_mget_keys_s"] / 1e6),
             num(r["redis_get_loop_keys_s"] / 1e6, 3), num(r["rocksdb_tier_keys_s"] / 1e6)] for r in res]
    md = table(["dim", "keys", "rows", "Redis tier", "redis-benchmark MGET (peer)", "GET loop (peer)", "RocksDB tier"],
               rows) + "\n(M keys/s)\n"
    uni = [r for r in res if r["dist"] == "uniform"]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    bars(ax, [f"dim {r['dim']}" for r in uni], [
        ("Redis tier", [r["redis_tier_keys_s"] / 1e6 for r in uni], OURS),
        ("redis-benchmark MGET (peer)", [r["redis_benchmark_mget_keys_s"] / 1e6 for r in uni], PEER),
        ("RocksDB tier", [r["rocksdb_tier_keys_s"] / 1e6 for r in uni], OURS2)], "M keys/s (higher is better)")
    return runs_table(names) + "\n" + md + save(fig, out, "hps_db")


def sec_hps_gpu(out: Path) -> str:
    names = RUNS["hps_gpu"]
    rows, plot = [], {}
    for n in names:
        d = load(n)
        gpu = d["info"]["gpu"].replace("NVIDIA ", "")
        for r in d["rows"]:
            rows.append([gpu, r["dim"], r["cache"], num(r["ms"], 3), num(r["ms_floor"], 3), num(r["of_floor"]),
                         num(r["ms_torch_gather"], 3), num(r["vs_torch_gather"]), num(r["gkeys_per_s"])])
            plot.setdefault(gpu, []).append(r)
    md = table(["GPU", "dim", "cache", "hit path ms", "plain gather ms (floor)", "of floor", "torch index_select ms",
                "ratio to torch", "G keys/s"], rows)
    fig, axes = plt.subplots(1, len(plot), figsize=(5 * len(plot), 3.4), squeeze=False)
    for ax, (gpu, rs) in zip(axes[0], sorted(plot.items())):
        labels = [f"dim {r['dim']}\n{r['cache']}" for r in rs]
        bars(ax, labels, [("torch.index_select (peer)", [r["ms_torch_gather"] for r in rs], PEER),
                          ("EmbedLab cache hit path", [r["ms"] for r in rs], OURS),
                          ("plain gather (floor)", [r["ms_floor"] for r in rs], FLOOR)], "ms (lower is better)")
        ax.set_title(gpu, fontsize=10)
    return runs_table(names) + "\n" + md + save(fig, out, "hps_gpu")


def sec_hps_server_gpu(out: Path) -> str:
    names = RUNS["hps_server_gpu"]
    rows, plot, hugectr = [], {}, {}
    for n in names:
        d = load(n)
        gpu = field(d, "machine", "gpu", file=n).replace("NVIDIA ", "")
        for r in field(d, "results", file=n):
            ref = r.get("hugectr_tf_hps_a100_whole_model_us")
            rows.append([gpu, r["dim"], f"{r['hit_target']:.0%}", num(r["hit_rate"], 3), f"{r['batch']:,}",
                         num(r["many_ms"], 3), num(r["flat_ms"], 3), num(r["bare_many_ms"], 3),
                         f"{r['many_minus_bare_many_us']:.0f} / {r['flat_minus_bare_many_us']:.0f}",
                         num(r["many_host_io_ms"], 3),
                         num(r["server_ms"], 3), num(r["bare_ms"], 3), num(r["server_over_bare"]),
                         num(r["host_io_ms"], 3), num(r.get("cpu_tier_ms"), 3), num(r["lookups_per_s"] / 1e6, 1),
                         num(ref / 1e3, 3) if ref else "-"])
            if r["hit_target"] == 1.0:
                plot.setdefault((gpu, r["dim"]), []).append(r)
            if ref:
                hugectr[r["batch"]] = ref / 1e3
    md = ("Wall time per model lookup (one batch looked up in each of the 26 tables), ms; lookups/s counts "
          "batch x tables. The last column is HugeCTR's published figure for its whole DLRM model (**the MLP "
          "included**, ours has none) served by \"TF with HPS\" on an A100 through Triton, beside ours for scale "
          "only. `-`: not measured in that run.\n\n" + table(
              ["GPU", "dim", "hits (target)", "hit rate", "batch", "lookup_many ms", "lookup_many(sizes=) ms",
               "bare many ms (floor)", "over the floor, us (lookup_many / sizes=)",
               "lookup_many, host keys and rows ms", "lookup per table ms", "bare cache ms (floor)",
               "per table / bare", "per table, host keys and rows ms", "CPU tier ms", "M lookups/s (per table)",
                                "HugeCTR TF+HPS, A100, whole model incl. MLP, ms (peer)"], rows))
    gpus = sorted({g for g, _ in plot})
    dims = sorted({d for _, d in plot})
    fig, axes = plt.subplots(len(gpus), len(dims), figsize=(5.5 * len(dims), 4.2 * len(gpus)), squeeze=False)
    for (gpu, dim), rs in sorted(plot.items()):
        ax = axes[gpus.index(gpu)][dims.index(dim)]
        rs = sorted(rs, key=lambda r: r["batch"])
        xs = [r["batch"] for r in rs]
        ax.plot(xs, [r["many_ms"] for r in rs], "*-", color="#9467bd", label="ParameterServer.lookup_many, GPU tier")
        ax.plot(xs, [r["flat_ms"] for r in rs], "x-", color="#8c564b", label="lookup_many(sizes=), GPU tier")
        ax.plot(xs, [r["bare_many_ms"] for r in rs], ":", color=FLOOR,
                label="fused cache kernel, all tables (floor of lookup_many)")
        ax.plot(xs, [r["server_ms"] for r in rs], "o-", color=OURS, label="ParameterServer.lookup per table, GPU tier")
        ax.plot(xs, [r["host_io_ms"] for r in rs], "s-", color=OURS2, label="GPU tier, host keys and rows")
        ax.plot(xs, [r["cpu_tier_ms"] if r.get("cpu_tier_ms") is not None else float("nan") for r in rs], "^-",
                color="#2ca02c", label="CPU tier")
        ax.plot(xs, [r["bare_ms"] for r in rs], "--", color=FLOOR, label="bare cache kernel per table (floor)")
        hb = sorted(hugectr)
        ax.plot(hb, [hugectr[b] for b in hb], "D", color=PEER,
                label="HugeCTR TF+HPS, A100, whole model incl. MLP (peer)")
        ax.set_xscale("log"), ax.set_yscale("log")
        ax.set_xlabel("batch"), ax.set_ylabel("ms per model lookup (lower is better)")
        ax.set_title(f"{gpu}, dim {dim}, 100 % hits", fontsize=10)
        ax.legend(fontsize=7)
    return runs_table(names) + "\n" + md + save(fig, out, "hps_server_gpu")


def sec_keras_rs(out: Path) -> str:
    names = RUNS["keras_rs"]
    rows, plot = [], {}
    for n in names:
        d = load(n)
        c, t = field(d, "config", file=n), field(d, "times_s", file=n)
        med = {k: statistics.median(v) * 1e3 for k, v in t.items()}
        machine, _ = hardware(n, d)
        tables = (f"Criteo Kaggle's (33.8M rows) x {c['dim']}" if c.get("criteo")
                  else f"{c['rows']:,} x {c['dim']}")
        for what in ("step", "forward"):
            rows.append([f"`{machine}`", tables, f"{c['batch']:,}", c["optimizer"], what,
                         num(med[f"keras_rs_{what}"]), num(med[f"embedlab_{what}"]),
                         f"**{num(field(d, 'median_ratio_keras_rs_over_embedlab', what, file=n))}x**",
                         f"{d['largest_relative_loss_difference']:.1e}" if what == "step" else ""])
        plot[f"{machine}, {tables}, {c['optimizer']}"] = med
    md = table(["machine", "26 tables of", "batch", "optimizer", "timed", "Keras-RS ms (peer)", "EmbedLab ms",
                "ratio (median of repeats)", "largest relative loss difference"], rows)
    notes = [f"`{n}`: {load(n)['config']['note']}" for n in names if load(n).get("config", {}).get("note")]
    if notes:
        md += "\nNotes recorded with the runs: " + "; ".join(notes) + "\n"
    fig, axes = plt.subplots(1, len(plot), figsize=(6 * len(plot), 3.4), squeeze=False)
    for ax, (machine, med) in zip(axes[0], sorted(plot.items())):
        bars(ax, ["train step", "forward"], [
            ("Keras-RS DistributedEmbedding (peer)", [med["keras_rs_step"], med["keras_rs_forward"]], PEER),
            ("embedlab.keras_rs.DistributedEmbedding", [med["embedlab_step"], med["embedlab_forward"]], OURS)],
             "ms, median of repeats (lower is better)")
        ax.set_title(machine, fontsize=10)
    return runs_table(names) + "\n" + md + save(fig, out, "keras_rs")


def sec_sparse_optimizers_gpu(out: Path) -> str:
    names = RUNS["sparse_optimizers_gpu"]
    rows, plot = [], {}
    for n in names:
        d = load(n)
        gpu = field(d, "info", "gpu", file=n).replace("NVIDIA ", "")
        for r in field(d, "results", file=n):
            chk = f"{field(r, 'check', 'max_abs_err', file=n):.1e}"
            rows.append([gpu, r["optimizer"], f"{r['rows']:,} x {r['dim']}", f"{r['batch']:,}", r["keys_per_lookup"],
                         num(r["embedlab_ms"], 3), num(r["torch_ms"], 3), f"**{num(r['speedup'])}x**", chk,
                         f"{r['max_abs_diff']:.1e}"])
            plot.setdefault(n, (gpu, []))[1].append(r)
    md = table(["GPU", "optimizer", "table", "batch", "keys per lookup", "EmbedLab fused backward + optimizer ms",
                "PyTorch embedding_bag backward + torch.optim ms (peer)", "ratio",
                "max abs error vs float64 (check)", "max abs difference vs PyTorch"], rows)
    fig, axes = plt.subplots(len(plot), 1, figsize=(max(6.0, 0.9 * max(len(rs) for _, rs in plot.values())),
                                                    3.4 * len(plot)), squeeze=False)
    for ax, (n, (gpu, rs)) in zip(axes[:, 0], sorted(plot.items())):
        bars(ax, [f"{r['optimizer']}\ndim {r['dim']}\n{r['keys_per_lookup']} key(s)" for r in rs], [
            ("PyTorch embedding_bag backward + torch.optim (peer)", [r["torch_ms"] for r in rs], PEER),
            ("EmbedLab fused backward + optimizer", [r["embedlab_ms"] for r in rs], OURS)],
             "ms per step (lower is better)")
        ax.set_title(f"{gpu}: {n}", fontsize=9)
    return runs_table(names) + "\n" + md + save(fig, out, "sparse_optimizers_gpu")


def sec_plugin_layer(out: Path) -> str:
    names = RUNS["plugin_layer"]
    rows, plot = [], {}
    for n in names:
        d = load(n)
        for case, c in field(d, "cases", file=n).items():
            rows.append([f"`{case}`", num(c["median_ms"]), num(c["p10_ms"]), num(c["p90_ms"])])
            plot[case] = c["median_ms"]
    md = table(["case", "median ms", "p10 ms", "p90 ms"], rows)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    cases = list(plot)
    ax.barh(cases[::-1], [plot[c] for c in cases][::-1], color=[OURS if c.startswith("own") else OURS2
                                                                 for c in cases][::-1])
    ax.set_xlabel("ms per training step (lower is better)")
    return runs_table(names) + "\n" + md + save(fig, out, "plugin_layer")


def sec_serving(out: Path) -> str:
    names = RUNS["serving"]
    pts = load(names[0])["points"]
    rows = [[p["name"], p["batch"], p["concurrency"], num(p["requests_per_s"], 0), num(p["rows_per_s"], 0),
             num(p["p50_ms"]), num(p["p99_ms"])] for p in pts]
    md = table(["model", "batch", "clients", "requests/s", "rows/s", "p50 ms", "p99 ms"], rows)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for name in dict.fromkeys(p["name"] for p in pts):
        ps = sorted((p for p in pts if p["name"] == name and p["concurrency"] == 1), key=lambda p: p["batch"])
        if ps:
            ax.plot([p["batch"] for p in ps], [p["rows_per_s"] for p in ps], "o-", label=name + (
                " (ceiling)" if "ceiling" not in name and "identity" in name else ""),
                color=FLOOR if "identity" in name else (OURS if "served" in name else PEER))
    ax.set_xscale("log"), ax.set_yscale("log"), ax.set_xlabel("batch"), ax.set_ylabel("rows/s, one client")
    ax.legend(fontsize=8)
    return runs_table(names) + "\n" + md + save(fig, out, "serving")


def sec_session(out: Path) -> str:
    names = RUNS["session"]
    rows = []
    for t in load(names[0])["throughput"]:
        rows.append([t["hidden"], f"{t['vocabulary']:,}", num(t["keras_samples_per_s"], 0),
                     num(t["session_Global_samples_per_s"], 0), num(t["session_Local_samples_per_s"], 0),
                     num(t["session_Global_samples_per_s"] / t["keras_samples_per_s"]),
                     num(t["session_Local_samples_per_s"] / t["keras_samples_per_s"])])
    md = table(["hidden units", "vocabulary", "Keras samples/s (peer)", "Session Global", "Session Local",
                "Global / Keras", "Local / Keras"], rows)
    o = load(names[1])["oversubscription"]
    md += (f"\nModel oversubscription: a store of {o['store_rows']:,} rows ({num(o['store_over_capacity'], 1)}x the "
           f"capacity of {o['capacity']:,} rows), {o['passes']} passes; a pass switch moves "
           f"{num(o['switch_MB'][0])} MB at a median {num(o['switch_MBps_median'], 0)} MB/s.\n")
    ts = load(names[0])["throughput"]
    fig, ax = plt.subplots(figsize=(7, 3.4))
    bars(ax, [f"{t['hidden']} units, {t['vocabulary']:,} ids" for t in ts], [
        ("Keras, same model (peer)", [t["keras_samples_per_s"] for t in ts], PEER),
        ("Session, Global Adam", [t["session_Global_samples_per_s"] for t in ts], OURS),
        ("Session, Local Adam", [t["session_Local_samples_per_s"] for t in ts], OURS2)], "samples/s (higher is better)")
    return runs_table(names) + "\n" + md + save(fig, out, "session")


def sec_sok(out: Path) -> str:
    names = RUNS["sok"]
    local, workers = load(names[0]), load(names[1])
    md = table(["case", "result"], [
        ["1 worker: `lookup_sparse` step, ms", num(local["sok_step_ms"])],
        ["1 worker: TF `safe_embedding_lookup_sparse` step (peer), ms", num(local["tf_step_ms"])],
        ["1 worker: ratio", f"**{num(local['speedup'])}x**"],
        [f"{workers['workers']} workers: step, ms", num(workers["step_ms"])],
        [f"{workers['workers']} workers: step without the exchange, ms", num(workers["step_no_exchange_ms"])],
        [f"{workers['workers']} workers: exchange share of the step", f"{workers['exchange_share']:.0%}"],
        [f"{workers['workers']} workers: bytes sent per worker per step",
         f"{sum(workers['bytes_sent_per_step'].values()):,}"]])
    rows, plot = [], {}
    for n in names[2:]:
        d = load(n)
        gpu = d["info"]["gpu"].replace("NVIDIA ", "")
        for r in d["runs"]:
            rows.append([gpu, r["owners"], f"{r['keys']:,}", num(r["pair_ms"], 3), num(r["torch_argsort_ms"], 3),
                         f"**{num(r['speedup_vs_torch'])}x**", num(r["keys_per_s"] / 1e9)])
            plot.setdefault(gpu, []).append(r)
    md += "\n**Routing kernels on a GPU** (count + scatter of the keys to their owners):\n\n" + table(
        ["GPU", "owners", "keys", "EmbedLab ms", "PyTorch argsort bucketing ms (peer)", "ratio", "G keys/s"], rows)
    fig, axes = plt.subplots(1, len(plot), figsize=(5 * len(plot), 3.4), squeeze=False)
    for ax, (gpu, rs) in zip(axes[0], sorted(plot.items())):
        bars(ax, [f"{r['owners']} owners" for r in rs], [
            ("PyTorch argsort bucketing (peer)", [r["torch_argsort_ms"] for r in rs], PEER),
            ("EmbedLab routing", [r["pair_ms"] for r in rs], OURS),
            ("memory floor", [r["memory_floor_ms"] for r in rs], FLOOR)], "ms (lower is better)")
        ax.set_title(gpu, fontsize=10)
    return runs_table(names) + "\n" + md + save(fig, out, "sok")


SECTIONS = {name[4:]: fn for name, fn in globals().items() if name.startswith("sec_")}


def no_run(name: str) -> str:
    """The generated text of a section whose benchmark has no recorded run: the page says so, and how to add one."""
    return (f"No run of `{name}` is recorded yet, so this section has no table or plot. The command above writes "
            f"`docs/benchmarks/results/{name}_<machine>_<UTC time>.json`; the page shows it once `RUNS` in "
            "`docs/benchmarks/generate.py` cites it.\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "_generated", help="folder for <benchmark>.md and .png")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    cited = {n for names in RUNS.values() for n in names}
    uncited = sorted(p.name for p in RESULTS.iterdir() if p.name not in cited)
    if uncited:
        raise ValueError(f"files in {RESULTS} that no section cites (cite them in RUNS or remove them): {uncited}")
    # A section lists its runs in RUNS; an empty list is a benchmark with no run yet. Runs need a sec_ function that
    # shows them, and a sec_ function needs a RUNS entry.
    unlisted = sorted(set(SECTIONS) - set(RUNS))
    if unlisted:
        raise ValueError(f"generate.py has sections with no RUNS entry (add one, [] for no run yet): {unlisted}")
    for name, names in RUNS.items():
        if names and name not in SECTIONS:
            raise ValueError(f"RUNS cites {names} for {name!r}, but generate.py has no sec_{name} to show them")
        (a.out / f"{name}.md").write_text(SECTIONS[name](a.out) if names else no_run(name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
