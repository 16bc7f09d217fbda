"""`Session`: HugeCTR v2.3's Python training interface (the solver arguments: `solver.py`).

A training script::

    from embedlab.session import Session, solver_parser_helper
    solver = solver_parser_helper(batchsize=16384, repeat_dataset=False)
    sess = Session(solver, "wdl.json", True, "./temp_embedding")
    reader = sess.get_data_reader_train()
    for file_list, keyset in dataset:
        reader.set_file_list_source(file_list)
        sess.get_model_oversubscriber().update(keyset)
        while sess.train():
            ...
    sess.download_params_to_files("./", iteration)

The model comes from a HugeCTR JSON file (`spec.parse_model`); the embeddings are hash tables
on EmbedLab's compiled lookup kernels with the optimizer fused into the backward (Adam / SGD,
`Local` or `LazyGlobal` updates) or TensorFlow update rules (MomentumSGD, Nesterov, any
`Global` update); the dense layers are TensorFlow ops. One training iteration is one compiled
`tf.function` call on one named structure of inputs (`step.StepInputs`): initialize the rows new
keys took, look up, forward, backward, update. Key -> row translation is the pipeline stage
between the reader and the step (`translate.KeyTranslation`), run in the data reader's
background thread, so the step only sees row indices.
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .. import sparse_model
from . import model_files
from .embedding import Embedding
from .layers import DenseModel
from .optimizer import TFOptimizer, lr_at
from .oversubscription import ModelOversubscriber, _fixed_mmap_threshold
from .reader import DataReader
from .solver import SolverConfig, solver_parser_helper
from .spec import ModelError, parse_model
from .step import StepInputs
from .translate import KeyTranslation

__all__ = ["Session", "SolverConfig", "solver_parser_helper", "ModelOversubscriber", "auc"]


def auc(labels, scores) -> float:
    """Area under the ROC curve (ties count one half), the Mann-Whitney way."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, np.float64).reshape(-1)
    p, n = int(labels.sum()), int((~labels).sum())
    if p == 0 or n == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s), np.float64)
    # average ranks over ties
    _, first, counts = np.unique(s, return_index=True, return_counts=True)
    avg = first + (counts + 1) / 2.0
    ranks[order] = np.repeat(avg, counts)
    return float((ranks[labels].sum() - p * (p + 1) / 2.0) / (p * n))


@tf.custom_gradient
def _scale_grad(x, s):
    def grad(dy):
        return dy * s, None
    return tf.identity(x), grad


class Session:
    """A HugeCTR JSON model trained on EmbedLab (see the module docstring).

    Args:
        solver_config: from `solver_parser_helper`.
        config_file: HugeCTR JSON model file (`optimizer` and `layers`; a `solver` clause is
            read, and overridden by `solver_config`).
        use_model_oversubscriber: train tables larger than the working tables pass by pass
            (`get_model_oversubscriber().update(keyset)` before each file list).
        temp_embedding_dir: folder for the host store (required with oversubscription).
    """

    def __init__(self, solver_config: SolverConfig, config_file, use_model_oversubscriber: bool = False,
                 temp_embedding_dir: str = ""):
        if not isinstance(solver_config, SolverConfig):
            raise TypeError("Session: solver_config must come from solver_parser_helper(...), got "
                            f"{type(solver_config).__name__}")
        self.solver = s = solver_config
        self.spec = spec = parse_model(config_file)
        self.config_file = str(config_file)
        self.device = self._pick_device(s.vvgpu)
        self.oversub = bool(use_model_oversubscriber)
        if self.oversub:
            if not temp_embedding_dir:
                raise ValueError("Session: use_model_oversubscriber=True needs a temp_embedding_dir")
            for e in spec.embeddings:
                if e.one_hot:
                    raise ModelError(f"{spec.path}: embedding {e.name!r} is one-hot; model oversubscription "
                                     "applies to hash embeddings")
        self.temp_embedding_dir = str(temp_embedding_dir)
        if self.oversub:
            _fixed_mmap_threshold()
        self.compute_dtype = tf.float16 if s.use_mixed_precision else tf.float32
        solver_clause = spec.solver or {}
        self.max_eval_batches = s.max_eval_batches or solver_clause.get("eval_batches")
        with tf.device(self.device):
            self.embeddings = [Embedding(e, s.seed, self.oversub, temp_embedding_dir) for e in spec.embeddings]
            self.dense = DenseModel(spec, s.seed)
            self.dense_opt = TFOptimizer(spec.optimizer)
            self.dense_slots = [self.dense_opt.make_slots(v.shape, v.name.split(":")[0])
                                for v in self.dense.weights()]
        self._lr_override = None
        self.iteration = 0
        self._loss = None
        self._step = StepInputs(spec.data, self.embeddings)
        self._keys = KeyTranslation(self.embeddings, spec.data)
        self._train_fn = self._build_train_fn()
        self._eval_fn = self._build_eval_fn()
        d = spec.data
        self.reader_train = DataReader(d, s.batchsize, s.i64_input_key, s.repeat_dataset, "train",
                                       default_source=d.source, raw_samples=d.num_samples, stage=self._keys)
        self.reader_eval = DataReader(d, s.batchsize_eval, s.i64_input_key, False, "eval",
                                      default_source=d.eval_source, raw_samples=d.eval_num_samples)
        self._oversubscriber = ModelOversubscriber(self) if self.oversub else None
        if s.model_file:
            self._load_dense(s.model_file)
        if s.embedding_files:
            self._load_embeddings(s.embedding_files)

    # ---- setup -------------------------------------------------------------------------

    @staticmethod
    def _pick_device(vvgpu):
        ids = [g for x in vvgpu for g in x]
        gpus = tf.config.list_logical_devices("GPU")
        if len(ids) != 1:
            raise ValueError(f"Session: vvgpu {vvgpu} names {len(ids)} devices; this Session trains on one "
                             "device (use [[0]])")
        if not gpus:
            if ids[0] != 0:
                raise ValueError(f"Session: vvgpu {vvgpu}: this machine has no GPU, so the one device is [[0]] "
                                 "(the CPU)")
            return "/CPU:0"
        if ids[0] >= len(gpus):
            raise ValueError(f"Session: vvgpu {vvgpu} names GPU {ids[0]} but TensorFlow sees {len(gpus)}")
        return f"/GPU:{ids[0]}"

    def _load_dense(self, path):
        ws = self.dense.weights()
        arrays, bn = model_files.read_dense(path, [tuple(v.shape) for v in ws],
                                            [l.name for l in self.spec.layers if self.dense.layer_weights[l.name]])
        for v, a in zip(ws, arrays):
            v.assign(a)
        for name, (m, var) in (bn or {}).items():
            if name in self.dense.bn:
                self.dense.bn[name][0].assign(m)
                self.dense.bn[name][1].assign(var)

    def _load_embeddings(self, files):
        if len(files) != len(self.embeddings):
            raise ValueError(f"Session: embedding_files lists {len(files)} sparse models but "
                             f"{self.config_file} has {len(self.embeddings)} embeddings")
        for f, e in zip(files, self.embeddings):
            m = sparse_model.read_sparse_model(f, dim=e.vec)
            e.load_model(m.keys, m.vectors, m.slot_ids)

    # ---- the compiled steps -----------------------------------------------------------

    def _loss_of(self, logit, label, batch):
        return self.dense.loss(logit, label, batch)

    def _build_train_fn(self):
        embs, dense, scaler = self.embeddings, self.dense, self.solver.scaler
        d = self.spec.data

        def step(inp):
            label, dns, it, lr_d, lr_e = inp["label"], inp["dense"], inp["iteration"], inp["lr_dense"], \
                inp["lr_embeddings"]
            per = inp["embeddings"]
            for e, x in zip(embs, per):
                e.init_rows(x["init_rows"], x["init_values"])
            for i, (e, x) in enumerate(zip(embs, per)):
                e.begin_step(x["rows"], lr_e[i])
            for i, e in enumerate(embs):
                if e.compiled:
                    e.kopt.learning_rate = lr_e[i]
            batch = tf.cast(tf.shape(label)[0], tf.float32)
            with tf.GradientTape() as tape:
                env = {d.label_top: label, d.dense_top: dns}
                for e, x in zip(embs, per):
                    out = e.lookup(x["splits"], x["rows"], train=True)
                    if scaler != 1.0:
                        out = _scale_grad(out, tf.constant(1.0 / scaler))
                    env[e.spec.top] = out
                logit = dense(env, training=True, compute_dtype=self.compute_dtype, seed=it)
                loss = self._loss_of(logit, label, batch)
                scaled = loss * scaler if scaler != 1.0 else loss
            ws = dense.weights()
            tables = [e.table for e in embs]
            grads = tape.gradient(scaled, ws + tables)
            gd, ge = grads[:len(ws)], grads[len(ws):]
            if scaler != 1.0:
                # The embeddings' gradients are unscaled already: `_scale_grad` above divides what
                # flows into each lookup by the scaler (the compiled lookups apply their update
                # inside their backward, so it has to happen there). The dense ones are not.
                gd = [None if g is None else g / scaler for g in gd]
            self.dense_opt.step.assign_add(1)
            self.dense_opt.apply_dense(gd, ws, self.dense_slots, lr_d, self.dense_opt.step)
            for i, (e, g, x) in enumerate(zip(embs, ge, per)):
                if not e.compiled:
                    e.apply(g, lr_e[i], x["rows_in_use"])
            return loss

        with tf.device(self.device):
            return tf.function(step, input_signature=[self._step.signature(True)], reduce_retracing=True)

    def _build_eval_fn(self):
        embs, dense = self.embeddings, self.dense
        d = self.spec.data

        def step(inp):
            label = inp["label"]
            env = {d.label_top: label, d.dense_top: inp["dense"]}
            for e, x in zip(embs, inp["embeddings"]):
                env[e.spec.top] = e.lookup(x["splits"], x["rows"], train=False)
            logit = dense(env, training=False, compute_dtype=self.compute_dtype)
            return tf.sigmoid(logit), self._loss_of(logit, label, tf.cast(tf.shape(label)[0], tf.float32))

        with tf.device(self.device):
            return tf.function(step, input_signature=[self._step.signature(False)], reduce_retracing=True)

    # ---- the HugeCTR API --------------------------------------------------------------

    def get_data_reader_train(self) -> DataReader:
        """The training reader (`set_file_list_source(file_list)` / `set_source`)."""
        return self.reader_train

    def get_data_reader_eval(self) -> DataReader:
        """The evaluation reader (`set_file_list_source(file_list)` / `set_source`)."""
        return self.reader_eval

    def get_model_oversubscriber(self) -> ModelOversubscriber:
        """The `update(keyset)` object of model oversubscription (also `get_model_prefetcher`)."""
        if self._oversubscriber is None:
            raise RuntimeError("Session: model oversubscription is off; create the Session with "
                               "use_model_oversubscriber=True and a temp_embedding_dir")
        return self._oversubscriber

    get_model_prefetcher = get_model_oversubscriber

    def start_data_reading(self):
        """Starts the training reader's background thread (`train()` does it when needed)."""
        self.reader_train.start()

    def set_learning_rate(self, lr: float):
        """Sets the learning rate of the dense optimizer and every embedding from the next
        iteration on (replacing the SGD warm-up / decay schedule, if any)."""
        if not isinstance(lr, (int, float)) or lr < 0:
            raise ValueError(f"Session.set_learning_rate: lr must be a number >= 0, got {lr!r}")
        self._lr_override = float(lr)

    def _lrs(self, step):
        if self._lr_override is not None:
            return self._lr_override, [self._lr_override] * len(self.embeddings)
        return lr_at(self.spec.optimizer, step), [lr_at(e.spec.optimizer, step) for e in self.embeddings]

    def train(self) -> bool:
        """One training iteration. Returns False, training nothing, once the file list is
        exhausted (`repeat_dataset=False`); the next `set_file_list_source` continues.

        Raises:
            FormatError: a bad file (naming the file list and the file); that batch is not trained.
            EmbeddingKeyError: a key the tables cannot place (naming the key and the slot); that
                batch is not trained.
        """
        batch = self.reader_train.next_batch()       # translated by the reader's KeyTranslation stage
        if batch is None:
            return False
        rows = self._keys.rows(batch)
        lr_d, lr_e = self._lrs(self.iteration + 1)
        self._loss = self._train_fn(self._step.train(batch, self._keys.inputs(batch), rows, self.iteration + 1,
                                                     lr_d, lr_e))
        self.iteration += 1
        self.last_batch_size = len(batch)
        return True

    def get_current_loss(self) -> float:
        """The loss of the last training iteration (a host sync)."""
        if self._loss is None:
            raise RuntimeError("Session.get_current_loss: no iteration has been trained yet")
        return float(self._loss)

    def evaluation(self):
        """Runs up to `max_eval_batches` batches of the evaluation list (from its start) and
        returns `[("AUC", value)]`. Keys absent from the working tables (never trained, or under
        oversubscription outside the loaded keysets) contribute nothing to their slot."""
        for e in self.embeddings:
            e.sync()
        r = self.reader_eval
        if not r.fresh:
            r.restart()
        preds, labels, losses = [], [], []
        n = 0
        while self.max_eval_batches is None or n < self.max_eval_batches:
            b = r.next_batch()
            if b is None:
                break
            p, l = self._eval_fn(self._step.eval(b, self._keys.inputs(b), self._keys.eval_rows(b)))
            preds.append(p.numpy())
            labels.append(b.label)
            losses.append(float(l))
            n += 1
        r.restart()   # read the first batches of the next evaluation in the background
        if not preds:
            raise RuntimeError(f"Session.evaluation: the evaluation list {r.file_list} gave no batch")
        self.last_eval_loss = float(np.mean(losses))
        return [("AUC", auc(np.concatenate(labels), np.concatenate(preds)))]

    def check_overflow(self):
        """Raises FloatingPointError naming the first table or dense weight holding inf / NaN."""
        for e in self.embeddings:
            e.sync()
            n = e.rows_in_use
            if n and not bool(tf.reduce_all(tf.math.is_finite(e.table[:n]))):
                raise FloatingPointError(f"Session.check_overflow: embedding {e.name!r} holds inf or NaN")
        for v in self.dense.weights():
            if not bool(tf.reduce_all(tf.math.is_finite(v))):
                raise FloatingPointError(f"Session.check_overflow: dense weight {v.name} holds inf or NaN")

    def download_params_to_files(self, prefix: str, iteration: int):
        """Writes `{prefix}_dense_{iteration}.model` and `{prefix}{i}_sparse_{iteration}.model`
        (one `embedlab.sparse_model` folder per embedding: `key`, `emb_vector`, and `slot_id`
        for localized embeddings). With oversubscription the sparse models hold the whole store.

        The set is written atomically: every file is written under a temporary name and
        flushed to disk, then all are renamed into place; if anything fails, none of the set
        changes (files of this iteration written earlier stay as they were).

        Args:
            prefix: the path prefix of the files (its folder is created if missing).
            iteration: the iteration number in the names.

        Returns:
            The written paths: the dense model file, then the sparse model folders.

        Raises:
            OSError: a file could not be written (naming it, with the OS's errno, e.g. ENOSPC on
                a full disk, and the OS's error as ``__cause__``).

        Example:
            >>> sess.download_params_to_files("ck", 100)            # doctest: +SKIP
            [PosixPath('ck_dense_100.model'), PosixPath('ck0_sparse_100.model')]
        """
        from pathlib import Path
        from .._io import atomic_set
        prefix, it = str(prefix), int(iteration)
        dense_path = Path(f"{prefix}_dense_{it}.model")
        bn = {k: (m.numpy(), v.numpy()) for k, (m, v) in self.dense.bn.items()}
        dense_files = model_files.dense_paths(dense_path, bn)
        sparse_paths = [Path(f"{prefix}{i}_sparse_{it}.model") for i in range(len(self.embeddings))]
        try:
            with atomic_set(dense_files + sparse_paths, fsync=True) as tmps:
                model_files.write_dense_into(tmps[:len(dense_files)], dense_path,
                                             [v.numpy() for v in self.dense.weights()], bn)
                for e, tmp in zip(self.embeddings, tmps[len(dense_files):]):
                    keys, vals, slots = e.export()
                    sparse_model.write_sparse_model(tmp, keys, vals, slots if e.spec.localized else None,
                                                    atomic=False)
        except OSError as err:
            msg = (f"cannot write {err.filename}: {err.strerror}" if err.filename is not None
                   else str(err.strerror or err))
            for tmp, final in zip(tmps, dense_files + sparse_paths):   # name the files, not their temporaries
                msg = msg.replace(str(tmp), str(final))
            raise OSError(err.errno, f"Session.download_params_to_files: {msg}; none of the "
                                     f"files of iteration {it} ({dense_path}, {', '.join(map(str, sparse_paths))}) "
                                     "was changed") from err
        return [dense_path] + sparse_paths

    def summary(self) -> str:
        """A text summary of the model, the embeddings and the solver (printed and returned)."""
        s, sp = self.solver, self.spec
        lines = [f"Session over {self.config_file} on {self.device}",
                 f"  data: {sp.data.format}, check {sp.data.check}, label_dim {sp.data.label_dim}, dense_dim "
                 f"{sp.data.dense_dim}, sparse inputs " + ", ".join(
                     f"{x.top} ({x.type}, {x.slot_num} slots, <= {x.max_feature_num_per_sample} keys)"
                     for x in sp.data.sparse)]
        for e in self.embeddings:
            o = e.spec.optimizer
            path = "compiled lookup with fused backward+update" if e.compiled else "TensorFlow update rule"
            lines.append(f"  embedding {e.name}: {e.spec.type}, vec {e.vec}, {e.spec.combiner}, capacity "
                         f"{e.capacity}, {o.type}/{o.update_type} ({path})"
                         + (", oversubscribed (host store: memory-mapped files)" if e.oversub else ""))
        for l in sp.layers:
            lines.append(f"  {l.type:<24} {l.name:<16} {','.join(l.bottoms)} -> {','.join(l.tops)} "
                         f"{[str(x) for x in l.out_shapes]}")
        lines.append(f"  dense weights: {self.dense.num_values()} float32 values; optimizer "
                     f"{sp.optimizer.type}/{sp.optimizer.update_type}")
        lines.append(f"  solver: seed {s.seed}, batchsize {s.batchsize}, batchsize_eval {s.batchsize_eval}, "
                     f"i64_input_key {s.i64_input_key}, repeat_dataset {s.repeat_dataset}, mixed precision "
                     f"{s.use_mixed_precision} (scaler {s.scaler}), max_eval_batches {self.max_eval_batches}")
        lines.append(f"  use_algorithm_search={s.use_algorithm_search}, use_cuda_graph={s.use_cuda_graph}: "
                     "accepted; they select cuBLAS algorithms and CUDA graphs in HugeCTR and change nothing here")
        text = "\n".join(lines)
        print(text)
        return text
