"""Session benchmark: Wide & Deep training throughput against the same model in Keras, and the
model-oversubscription pass switch.

1. Throughput, in one run: `embedlab.session.Session` over Norm file lists (HugeCTR's W&D JSON,
   sized for the data) against the W&D written by hand in Keras (`tf.keras.layers.Embedding`,
   `model.fit` on a TFRecord `tf.data` pipeline, Keras Adam), same batch, same data, at two
   MLP widths: the notebook's (narrow, embedding-heavy) and HugeCTR's 1024-1024-1. Each run
   in a fresh process, interleaved over `--repeats` rounds; medians. Also the Session's step
   breakdown (reader wait + translation, the compiled step).
2. Oversubscription: a table 10x larger than the working capacity, trained pass by pass; the
   rate of each pass switch (bytes of row data written back + loaded, over its time) and the
   process's RSS over the run (peak vs working capacity x row size).

    python helpers/benchmarks/session.py [--rows 200000] [--batch 2048] [--out results/]
    # embedding-heavy tables: keep every id (vocabulary 830,084 at 2M rows), narrow MLP only
    python helpers/benchmarks/session.py --rows 2000000 --freq-threshold 1 --wide 0

Prints a table and writes `docs/benchmarks/results/session_<machine>_<date>T<time>Z.json`
(`session_oversub_...` with `--skip-throughput`), and a PNG of RSS next to it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import sys
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import RESULTS_DIR, cpu_machine, default_out  # noqa: E402

import numpy as np


def _one_measure(kind, jp, lists, tfr, vocabulary, hidden, batch, lr):
    """samples/s of one configuration (run in a fresh process, see `throughput`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from embedlab.session import Session, solver_parser_helper
    from embedlab.tutorials import session_lab as lab
    if kind == "keras":
        model = lab.keras_wdl(vocabulary, hidden=hidden, lr=lr)
        ds = lab.keras_wdl_dataset(str(tfr), batch)
        return lab.time_keras_fit(model, ds)[0], 0
    sess = Session(solver_parser_helper(batchsize=batch, seed=0), str(jp))
    sps, it = lab.time_session_train(sess, lists)
    sess.get_data_reader_train().close()
    return sps, it


def throughput(work, rows, batch, hidden_list, lr=1e-3, freq_threshold=6, repeats=3):
    """Session (Global and Local updates) against Keras, per MLP width. Every measurement runs
    in a fresh process (what one process ran before, threads and heap included, slowed the
    next by up to 20 %), the three interleaved over `repeats` rounds; medians."""
    import multiprocessing as mp
    from embedlab.data import formats
    from embedlab.tutorials import session_lab as lab
    meta = lab.prepare_wdl_data(work / "data", rows, n_lists=5, freq_threshold=freq_threshold)
    tfr = work / f"train_{rows}_f{freq_threshold}.tfrecord"
    if not tfr.exists():
        formats.parquet_to_tfrecord(meta["parquet"]["train"], tfr)
    here = Path(__file__).resolve().parents[1] / "tests" / "session" / "data" / "wdl.json"
    ctx = mp.get_context("spawn")
    out = []
    for hidden in hidden_list:
        j = json.loads(here.read_text())
        j.pop("solver")
        jp = work / f"wdl_{hidden}.json"
        jp.write_text(json.dumps(j))
        lab.set_capacity(jp, meta["vocabulary"] + 16, hidden=hidden)
        row = {"hidden": hidden, "batch": batch, "rows": meta["split_rows"]["train"],
               "freq_threshold": freq_threshold, "vocabulary": meta["vocabulary"], "repeats": repeats}
        paths = {}
        for upd in ("Global", "Local"):
            jj = json.loads(jp.read_text())
            jj["optimizer"]["update_type"] = upd
            paths[upd] = work / f"wdl_{hidden}_{upd}.json"
            paths[upd].write_text(json.dumps(jj))
        runs = {"keras": [], "Global": [], "Local": []}
        for _ in range(repeats):
            for kind in runs:
                with ctx.Pool(1) as pool:
                    sps, it = pool.apply(_one_measure, (kind, paths.get(kind), meta["lists"], tfr,
                                                        meta["vocabulary"], hidden, batch, lr))
                runs[kind].append(sps)
                if it:
                    row[f"session_{kind}_iterations"] = it
        for kind, v in runs.items():
            name = "keras_samples_per_s" if kind == "keras" else f"session_{kind}_samples_per_s"
            row[name] = float(np.median(v))
            row[name + "_runs"] = v
        ksps = row["keras_samples_per_s"]
        row["ratio_Global"] = row["session_Global_samples_per_s"] / ksps
        row["ratio_Local"] = row["session_Local_samples_per_s"] / ksps
        out.append(row)
        print(f"hidden {hidden:5d}  batch {batch}: Session Global {row['session_Global_samples_per_s']:9.0f}/s  "
              f"Local {row['session_Local_samples_per_s']:9.0f}/s  Keras {ksps:9.0f}/s  "
              f"ratio {row['ratio_Global']:.2f}x / {row['ratio_Local']:.2f}x  (medians of {repeats})", flush=True)
    return out


def step_breakdown(work, rows, batch, hidden, freq_threshold=6):
    """Per iteration: waiting for the reader (parse + translate run in its thread), building the
    step's inputs, and the compiled step itself (forward, backward, updates)."""
    import embedlab
    tf = embedlab.import_tensorflow()
    from embedlab.session import Session, solver_parser_helper
    from embedlab.tutorials import session_lab as lab
    meta = lab.prepare_wdl_data(work / "data", rows, n_lists=5, freq_threshold=freq_threshold)
    jp = work / f"wdl_{hidden}_Global.json"
    sess = Session(solver_parser_helper(batchsize=batch, seed=0, repeat_dataset=True), str(jp))
    r = sess.get_data_reader_train()
    r.set_file_list_source(meta["lists"][0])
    sess.train()
    sess.get_current_loss()
    t_wait = t_step = 0.0
    n = 20
    orig = sess._train_fn
    for _ in range(n):
        t0 = time.perf_counter()
        b = r.next_batch()
        t1 = time.perf_counter()
        r_next = b
        sess.reader_train.next_batch = lambda r_next=r_next: r_next
        sess.train()
        sess.get_current_loss()
        t2 = time.perf_counter()
        del sess.reader_train.next_batch
        t_wait += t1 - t0
        t_step += t2 - t1
    del orig, tf
    return {"reader_wait_ms": 1e3 * t_wait / n, "step_ms": 1e3 * t_step / n}


def oversubscription(work, capacity, factor, vec, batch, passes):
    """A table `factor` x capacity trained pass by pass; switch rates and RSS."""
    import threading
    from embedlab.data import formats
    from embedlab.session import Session, solver_parser_helper
    from embedlab.tutorials import session_lab as lab
    rng = np.random.default_rng(0)
    d = work / "over"
    d.mkdir(exist_ok=True)
    total = capacity * factor
    per_pass = int(capacity * 0.9)
    slots = 4
    lists, keysets = [], []
    samples = -(-per_pass // slots // batch) * batch         # every keyset key is trained
    for p in range(passes):
        # each pass touches its own window of the key space (the whole space over the passes)
        lo = (p * per_pass) % (total - per_pass)
        keys = lo + rng.permutation(per_pass)
        need = samples * slots
        ks = np.concatenate([keys, rng.choice(keys, need - per_pass)]) if need > per_pass else keys[:need]
        ks = rng.permutation(ks)[:need].reshape(samples, slots)
        f = d / f"p{p}.data"
        formats.write_norm(f, (rng.random(samples) > 0.5).astype(np.float32), rng.random((samples, 13)),
                           [ks[:, s] for s in range(slots)], key_type="int64")
        formats.write_file_list(d / f"l{p}.txt", [f])
        formats.write_keyset(d / f"l{p}.keyset", keys, key_type="int64")
        lists.append(str(d / f"l{p}.txt"))
        keysets.append(str(d / f"l{p}.keyset"))
    j = {"optimizer": {"type": "Adam", "update_type": "Local",
                       "adam_hparam": {"learning_rate": 1e-3, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}},
         "layers": [{"name": "data", "type": "Data", "check": "Sum", "label": {"top": "label", "label_dim": 1},
                     "dense": {"top": "dense", "dense_dim": 13},
                     "sparse": [{"top": "s", "type": "DistributedSlot", "max_feature_num_per_sample": slots,
                                 "slot_num": slots}]},
                    {"name": "emb", "type": "DistributedSlotSparseEmbeddingHash", "bottom": "s", "top": "e",
                     "sparse_embedding_hparam": {"max_vocabulary_size_per_gpu": capacity, "embedding_vec_size": vec,
                                                 "combiner": 0}},
                    {"name": "r", "type": "Reshape", "bottom": "e", "top": "r", "leading_dim": slots * vec},
                    {"name": "c", "type": "Concat", "bottom": ["r", "dense"], "top": "c"},
                    {"name": "fc", "type": "InnerProduct", "bottom": "c", "top": "fc", "fc_param": {"num_output": 1}},
                    {"name": "loss", "type": "BinaryCrossEntropyLoss", "bottom": ["fc", "label"], "top": "loss"}]}
    jp = d / "m.json"
    jp.write_text(json.dumps(j))
    rss0 = lab.rss_mb()
    sess = Session(solver_parser_helper(batchsize=batch, i64_input_key=True), str(jp), True, str(d / "store"))
    rss_built = lab.rss_mb()
    samples_rss = []
    stop = threading.Event()
    t0 = time.perf_counter()

    def probe():
        while not stop.is_set():
            samples_rss.append((time.perf_counter() - t0, lab.rss_mb()))
            time.sleep(0.05)

    th = threading.Thread(target=probe, daemon=True)
    th.start()
    r = sess.get_data_reader_train()
    for fl, ks in zip(lists, keysets):
        r.set_file_list_source(fl)
        sess.get_model_oversubscriber().update(ks)
        while sess.train():
            pass
    sess.get_model_oversubscriber().update(keysets[0])     # a last switch writes the last pass back
    stop.set()
    th.join()
    sw = sess.get_model_oversubscriber().switches[1:]
    rates = [s["bytes"] / s["seconds"] / 1e6 for s in sw]
    row_bytes = 4 * vec * 3
    store = sess.embeddings[0].store
    peak = max(v for _, v in samples_rss)
    return {"capacity": capacity, "vec": vec, "row_bytes_with_adam_state": row_bytes, "store_rows": len(store),
            "store_over_capacity": len(store) / capacity, "passes": passes,
            "switch_MBps": rates, "switch_MBps_median": float(np.median(rates)),
            "switch_MB": [s["bytes"] / 1e6 for s in sw],
            "rss_before_session_MB": rss0, "rss_after_build_MB": rss_built, "rss_peak_MB": peak,
            "working_table_MB": capacity * row_bytes / 2**20,
            "peak_over_pre_session_MB": peak - rss0, "rss_trace": samples_rss}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=2048)
    ap.add_argument("--narrow", type=int, default=128, help="hidden width of the notebook's configuration")
    ap.add_argument("--wide", type=int, default=1024, help="HugeCTR's hidden width (0: leave it out)")
    ap.add_argument("--freq-threshold", type=int, default=6,
                    help="preprocessing frequency threshold (HugeCTR's 6; 1 keeps every id: a larger vocabulary)")
    ap.add_argument("--capacity", type=int, default=200_000)
    ap.add_argument("--vec", type=int, default=16)
    ap.add_argument("--passes", type=int, default=12)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved rounds of the throughput runs")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--out", default=str(RESULTS_DIR))
    a = ap.parse_args()
    import embedlab
    tf = embedlab.import_tensorflow()
    work = Path(tempfile.mkdtemp(prefix="embedlab-session-bench-"))
    res = {"machine": cpu_machine(), "cpus": os.cpu_count(), "platform": platform.platform(),
           "tensorflow": tf.__version__, "date": dt.datetime.utcnow().isoformat(timespec="seconds") + "Z",
           "args": vars(a)}
    if not a.skip_throughput:
        widths = [a.narrow] + ([a.wide] if a.wide else [])
        res["throughput"] = throughput(work, a.rows, a.batch, widths, freq_threshold=a.freq_threshold,
                                       repeats=a.repeats)
        res["breakdown"] = {h: step_breakdown(work, a.rows, a.batch, h, freq_threshold=a.freq_threshold)
                            for h in widths}
        print("step breakdown (ms per iteration):", json.dumps(res["breakdown"]))
    ov = oversubscription(work, a.capacity, 10, a.vec, a.batch, a.passes)
    res["oversubscription"] = ov
    print(f"oversubscription: capacity {a.capacity} rows x {ov['row_bytes_with_adam_state']} B, store "
          f"{ov['store_rows']} rows ({ov['store_over_capacity']:.1f}x): pass switch median "
          f"{ov['switch_MBps_median']:.0f} MB/s; RSS peak {ov['rss_peak_MB']:.0f} MB, before the Session "
          f"{ov['rss_before_session_MB']:.0f} MB, increase {ov['peak_over_pre_session_MB']:.0f} MB vs working "
          f"table {ov['working_table_MB']:.0f} MB + 300 MB")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "session_oversub" if a.skip_throughput else "session"
    stem = default_out(name, cpu_machine()).stem
    (out / f"{stem}.json").write_text(json.dumps(res, indent=1))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        t, m = zip(*ov["rss_trace"])
        plt.figure(figsize=(6, 3))
        plt.plot(t, m, label="RSS")
        plt.axhline(ov["rss_before_session_MB"] + ov["working_table_MB"] + 300, color="r", ls="--",
                    label="before + working table + 300 MB")
        plt.xlabel("s"), plt.ylabel("MiB"), plt.legend(), plt.tight_layout()
        plt.savefig(out / f"{stem}_rss.png", dpi=80)
    except Exception as e:  # noqa: BLE001
        print("no plot:", e)
    print("wrote", out / f"{stem}.json")


if __name__ == "__main__":
    main()
