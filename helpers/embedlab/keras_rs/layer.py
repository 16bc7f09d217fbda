"""`DistributedEmbedding` and `EmbedReduce`: Keras-RS's layers on EmbedLab's kernels
(`embedlab.keras_rs`'s docstring describes the semantics)."""
from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import tensorflow as tf
from keras_rs.src.layers.embedding import distributed_embedding_config as _config
from keras_rs.src.layers.embedding.embed_reduce import EmbedReduce as _KerasRsEmbedReduce
from keras_rs.src.layers.embedding.tensorflow.distributed_embedding import \
    DistributedEmbedding as _KerasRsDistributedEmbedding
from tensorflow.python.ops import resource_variable_ops

from .. import _lookup, ops
from .. import optimizers as _el_optimizers  # noqa: F401  (registers them for loading saved models)
from ..sparse_input import SparseInput
from . import xla as _xla
from .inputs import COMBINERS, feature_input
from .optimizers import optimizer_key, to_embedlab

__all__ = ["DistributedEmbedding", "EmbedReduce"]

TableConfig = _config.TableConfig
FeatureConfig = _config.FeatureConfig


@keras.saving.register_keras_serializable(package="embedlab")
class EmbedReduce(_KerasRsEmbedReduce):
    """Keras-RS's `EmbedReduce` (an embedding of one table pooled by a combiner) on EmbedLab's
    kernel: same arguments, variables and results; the gradient is an `IndexedSlices` of the
    touched rows (the model's optimizer trains the table).

    Example:
        >>> layer = EmbedReduce(10, 4, combiner="sum", embeddings_initializer="ones")
        >>> layer(tf.constant([[1, 2], [3, 3]])).numpy()[:, 0].tolist()
        [2.0, 2.0]
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Keras compiles a model with XLA ("auto") only when every layer supports it: the custom
        # kernels are faster than the XLA path (module `xla`), which only explicit XLA gets.
        self.supports_jit = False

    def call(self, inputs, weights=None):
        where = f"EmbedReduce {self.name!r}"
        xla = _xla.in_xla_context()
        x, combiner, lead = feature_input(inputs, weights, self.combiner, None, where, static_shapes=xla)
        if xla:
            _xla.log_xla_once(where)
            rows, keys, w, nrows = _xla.flat_ids(x)
            table = _lookup.as_variable(self.embeddings)
            out = _xla.pool(lambda k: tf.gather(table, k), rows, keys,
                            _xla.entry_scales(keys, w, rows, nrows, combiner), nrows)
        else:
            out = ops.fused_embedding_lookup([self.embeddings], [x], [combiner])[0]
        return _reshape(out, lead, self.output_dim)


def _reshape(out, lead, dim):
    if lead is None:
        return out
    return tf.reshape(out, tf.concat([lead, [dim]], 0))


def _convert_tpu_configs(feature_configs):
    """`tf.tpu.experimental.embedding.FeatureConfig`s as Keras-RS `FeatureConfig`s (tables shared
    as the TPU configs share them); Keras-RS configs are returned as they are."""
    tpu_fc = tf.tpu.experimental.embedding.FeatureConfig
    tables = {}

    def convert(fc):
        if not isinstance(fc, tpu_fc):
            return fc
        where = f"DistributedEmbedding: tf.tpu FeatureConfig {fc.name!r}"
        if fc.max_sequence_length:
            raise ValueError(f"{where}: max_sequence_length={fc.max_sequence_length} (sequence features, "
                             "[batch, length, dim] output) is not supported; pooled features only")
        t = fc.table
        if id(t) not in tables:
            init = t.initializer
            tables[id(t)] = TableConfig(
                name=t.name, vocabulary_size=t.vocabulary_size, embedding_dim=t.dim,
                initializer=init if init is not None else keras.initializers.TruncatedNormal(
                    stddev=1.0 / np.sqrt(t.dim)),
                optimizer=to_embedlab(t.optimizer, f"{where}, table {t.name!r}") if t.optimizer is not None else None,
                combiner=t.combiner, placement="default_device")
        out_shape = list(fc.output_shape) if fc.output_shape else [None]
        return FeatureConfig(name=fc.name, table=tables[id(t)], input_shape=(None, None),
                             output_shape=tuple(out_shape) + (t.dim,))

    return keras.tree.map_structure(convert, feature_configs)


@keras.saving.register_keras_serializable(package="embedlab")
class DistributedEmbedding(_KerasRsDistributedEmbedding):
    """Keras-RS's `DistributedEmbedding` with all tables in one fused EmbedLab lookup and each
    table's optimizer fused into the lookup's backward.

    Args:
        feature_configs: a nested structure (dict, list, ...) of `keras_rs.layers.FeatureConfig`
            (or `tf.tpu.experimental.embedding.FeatureConfig`); features may share a table.
        table_stacking: accepted as in Keras-RS ("auto", None, table names, or lists of them);
            names are checked. On CPU/GPU it changes nothing: every table of the layer already
            goes through one fused lookup (TPU stacking exists to make one lookup of many).
        update_stats: must be False (as Keras-RS on TensorFlow).
        optimizer_in_backward: True (default): each table whose `TableConfig.optimizer` is
            set is trained by that optimizer (`embedlab.keras_rs.optimizers` lists the honoured
            options) on the touched rows inside the backward of the lookup, as on SparseCore;
            such tables are not trainable variables (the model's optimizer keeps no state for
            them) and a trainable scalar `bp_trigger` (zero gradient) runs the update.
            A table whose optimizer is None, or every table with False, is a trainable variable
            that the model's optimizer trains from an `IndexedSlices` gradient (Keras-RS's
            `default_device` behaviour).
        sharding: None (default: every table whole in this process) or "row": each table
            split row-wise over the workers of `embedlab.sok` (SOK's "distributed" mode: row i
            on rank i % n, a `sok.Variable` shard per worker; `sok.init()` is called), looked up
            by `sok.lookup_sparse` (keys all-to-all to their owners, rows back) and trained by
            each table's fused optimizer on the shard's gradient, which holds every worker's
            contributions (nothing is all-reduced). Row-wise rather than table-wise: the work
            and memory of a worker do not depend on how the tables' sizes fall. Every table
            needs an optimizer (a table trained by the model's optimizer would be all-reduced as
            a whole). Each worker computes the full initial table from the initializer and keeps
            its rows (seed the initializer to start every worker from the same table). Under
            `tf.distribute.MultiWorkerMirroredStrategy`, build the layer (`layer.build(shapes)`,
            which makes the shards) before the first step, and call the model inside
            `strategy.run` with this worker's part of the global batch (every worker calls it:
            the lookup is a collective); 1 and 2 workers give the same losses
            and tables (to float32 summation order). Saving: `embedlab.sok.dump(path,
            list(layer.shards.values()))`, or `export_hps(path)` (gathers); `.keras` saving is
            refused.
        **kwargs: Keras layer arguments (name, dtype, ...).

    Call: `layer(inputs, weights=None, training=False)` with `inputs` (and `weights`) shaped like
    `feature_configs`, or `layer(layer.preprocess(inputs, weights))`; returns the same
    structure of `[batch, dim]` float32 activations (`[..., dim]` for dense `[..., n]` ids).

    Example:
        >>> t = TableConfig("t", vocabulary_size=10, embedding_dim=4, optimizer="sgd", combiner="sum")
        >>> fcs = {"a": FeatureConfig("a", t, (2, 3), (2, 4)), "b": FeatureConfig("b", t, (2, 1), (2, 4))}
        >>> layer = DistributedEmbedding(fcs)
        >>> out = layer({"a": tf.ragged.constant([[1, 2], [3]]), "b": tf.constant([[4], [5]])})
        >>> out["a"].shape.as_list(), out["b"].shape.as_list()
        ([2, 4], [2, 4])
    """

    def __init__(self, feature_configs, *, table_stacking="auto", update_stats=False,
                 optimizer_in_backward=True, sharding=None, **kwargs):
        if sharding not in (None, "row"):
            raise ValueError(f"DistributedEmbedding: sharding must be None or 'row', got {sharding!r}")
        self._optimizer_in_backward = bool(optimizer_in_backward)
        self._sharding = sharding
        super().__init__(_convert_tpu_configs(feature_configs), table_stacking=table_stacking,
                         update_stats=update_stats, **kwargs)
        self._allow_non_tensor_positional_args = True
        # jit_compile="auto" keeps the custom kernels; explicit XLA gets the XLA path (`xla`).
        self.supports_jit = False

    # ---- construction ---------------------------------------------------------------------

    def _has_sparsecore(self):
        return False

    def _default_device_init(self, feature_configs, table_stacking):
        where = f"DistributedEmbedding {self.name!r}"
        tables, index = [], {}
        self._feature_table = {}
        for path, fc in feature_configs.items():
            if id(fc.table) not in index:
                index[id(fc.table)] = len(tables)
                tables.append(fc.table)
            self._feature_table[path] = index[id(fc.table)]
        names = [t.name for t in tables]
        for t in tables:
            if names.count(t.name) > 1:
                raise ValueError(f"{where}: two different TableConfigs are named {t.name!r}; table names must be "
                                 "unique (share one TableConfig object to share a table)")
            if t.combiner not in COMBINERS:
                raise ValueError(f"{where}: table {t.name!r} has combiner {t.combiner!r}; use one of {COMBINERS}")
            for arg in ("vocabulary_size", "embedding_dim"):
                v = getattr(t, arg)
                if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < 1:
                    raise ValueError(f"{where}: table {t.name!r} has {arg}={v!r}; it must be a positive int")
        self._check_table_stacking(table_stacking, names, where)
        self._table_stacking = table_stacking
        self._table_configs = tables

        # One optimizer per distinct (kind, hyperparameters): one fused update op per group.
        opts, by_key, self._table_optimizer = [], {}, []
        for t in tables:
            if not self._optimizer_in_backward or t.optimizer is None:
                self._table_optimizer.append(None)
                continue
            opt = to_embedlab(t.optimizer, f"{where}: table {t.name!r}")
            key = optimizer_key(opt)
            if key not in by_key:
                by_key[key] = len(opts)
                opts.append(opt)
            self._table_optimizer.append(by_key[key])
        self._optimizers = opts

        if self._sharding is not None:
            missing = [t.name for t, o in zip(tables, self._table_optimizer) if o is None]
            if missing:
                raise ValueError(f"{where}: sharding={self._sharding!r} needs a fused optimizer on every table "
                                 f"(TableConfig.optimizer set, optimizer_in_backward=True); tables {missing} have none")
            from .. import sok as _sok   # here: only a sharded layer starts embedlab.sok
            _sok.init()
            self._table_layers = []
            self._default_device_embedding_layers = {}
            self._shards = None   # made in build: one sok.Variable per table
            self._shard_optimizers = [_sok.OptimizerWrapper(opt) for opt in opts]
            self.bp_trigger = self.add_weight(name="bp_trigger", shape=(), initializer="zeros", trainable=True,
                                              dtype="float32")
            return

        layers = []
        for t, o in zip(tables, self._table_optimizer):
            layers.append(EmbedReduce(name=t.name, input_dim=t.vocabulary_size, output_dim=t.embedding_dim,
                                      embeddings_initializer=t.initializer, combiner=t.combiner,
                                      trainable=o is None))
        self._table_layers = layers
        self._default_device_embedding_layers = {p: layers[i] for p, i in self._feature_table.items()}
        if opts:
            # HugeCTR's bp_trigger: its (zero) gradient is what runs the fused updates.
            self.bp_trigger = self.add_weight(name="bp_trigger", shape=(), initializer="zeros", trainable=True,
                                              dtype="float32")

    @staticmethod
    def _check_table_stacking(table_stacking, names, where):
        if table_stacking is None or isinstance(table_stacking, str):
            if table_stacking not in (None, "auto") and table_stacking not in names:
                raise ValueError(f"{where}: table_stacking must be 'auto', None or table names, got "
                                 f"{table_stacking!r} (tables: {names})")
            return
        for group in table_stacking:
            for name in ([group] if isinstance(group, str) else group):
                if name not in names:
                    raise ValueError(f"{where}: table_stacking names table {name!r}, which is not one of {names}")

    def _default_device_build(self, input_shapes):
        if self._sharding is not None:
            self._build_shards()
            return
        for layer in self._table_layers:
            if not layer.built:
                layer.build((None,))
        for g, opt in enumerate(self._optimizers):
            if not opt.built:
                opt.build([self._table_layers[t].embeddings for t, o in enumerate(self._table_optimizer) if o == g])

    def _build_shards(self):
        if self._shards is not None:
            return
        from .. import sok as _sok

        shards = []
        for t in self._table_configs:
            init = keras.initializers.get(t.initializer)
            full = np.asarray(keras.ops.convert_to_numpy(init((t.vocabulary_size, t.embedding_dim), dtype="float32")))
            shards.append(_sok.Variable(full, mode="distributed", name=f"{self.name}/{t.name}", trainable=False))
        for g, wrapper in enumerate(self._shard_optimizers):
            wrapper.build([shards[t] for t, o in enumerate(self._table_optimizer) if o == g])
        # A tuple inside a list: Keras does not track the shards as the layer's own weights.
        self._shards = [tuple(shards)]

    @property
    def shards(self) -> dict:
        """Table name -> this worker's `embedlab.sok.Variable` shard (sharding="row" only)."""
        if self._sharding is None:
            raise ValueError(f"DistributedEmbedding {self.name!r}: shards exist with sharding='row' only")
        if self._shards is None:
            raise ValueError(f"DistributedEmbedding {self.name!r}: the layer is not built yet")
        return {t.name: v for t, v in zip(self._table_configs, self._shards[0])}

    def _sharded_lookup(self, ids, combiners):
        """sok.lookup_sparse of the shards, whose backward applies each table's optimizer to its
        shard's gradient (every worker's contributions summed by the all-to-all's gradient)."""
        from .. import sok as _sok

        shards = list(self._shards[0])
        groups = {}
        for t, g in enumerate(self._table_optimizer):
            groups.setdefault(g, []).append(t)
        wrappers = self._shard_optimizers

        @tf.custom_gradient
        def lookup(trigger):
            with tf.GradientTape(watch_accessed_variables=False) as inner:
                for v in shards:
                    inner.watch(v)
                outs = _sok.lookup_sparse(shards, ids, combiners=combiners)

            def grad(*dys, variables=None):
                dys = [tf.zeros_like(o) if d is None else d for o, d in zip(outs, dys)]
                grads = inner.gradient(outs, shards, output_gradients=dys)
                for g, ts in groups.items():
                    wrappers[g].apply_gradients([(grads[t], shards[t]) for t in ts])
                z = tf.zeros_like(trigger)
                return (z, [None] * len(variables)) if variables else z

            return outs, grad

        return lookup(self.bp_trigger.value)

    # ---- the lookup -----------------------------------------------------------------------

    def _default_device_call(self, inputs, weights=None, training=False):
        del training
        where = f"DistributedEmbedding {self.name!r}"
        n = len(self._table_configs)
        per_table = [[] for _ in range(n)]   # (path, SparseInput, lead) of each table's features
        xla = _xla.in_xla_context()
        kernel_comb = [None] * n
        for path, x in inputs.items():
            t = self._feature_table[path]
            fc = self._placement_to_path_to_feature_config["default_device"][path]
            shape = fc.input_shape
            max_len = shape[-1] if shape is not None and len(shape) >= 2 and isinstance(shape[-1], int) else None
            w = None if weights is None else weights.get(path)
            si, comb, lead = feature_input(x, w, self._table_configs[t].combiner, max_len,
                                           f"{where}: feature {path!r}", static_shapes=xla)
            per_table[t].append((path, si, lead, comb))
        if xla:
            return self._xla_call(per_table, where)
        # A table pooled "sum" for one feature (one id per row, or sqrtn) and "mean" for another
        # pools "sum" throughout, the mean rows weighted 1 / (their summed weights).
        mixed = [len({c for *_, c in feats}) > 1 for feats in per_table]
        weighted = any(m or any(si.has_weights for _, si, _, _ in feats) for m, feats in zip(mixed, per_table))
        ids, rows = [], []
        for t, feats in enumerate(per_table):
            kernel_comb[t] = "sum" if mixed[t] else feats[0][3]
            if len(feats) == 1 and feats[0][1].has_weights == weighted:
                ids.append(feats[0][1])
                rows.append(None)
                continue
            ids.append(_concat([(si, c) for _, si, _, c in feats], mixed[t], weighted))
            rows.append([si.batch_size for _, si, _, _ in feats])
        if self._sharding is not None:
            outs = self._sharded_lookup(ids, kernel_comb)
        elif self._optimizers:
            tables = [layer.embeddings for layer in self._table_layers]
            # One fused lookup whose backward applies each table's fused optimizer (tables with
            # one) or returns the IndexedSlices gradient (tables the model's optimizer trains).
            outs = _lookup.training_lookup(
                tables, ids, None, kernel_comb,
                [None if g is None else self._optimizers[g] for g in self._table_optimizer],
                self.bp_trigger, where)
        else:
            outs = ops.fused_embedding_lookup([layer.embeddings for layer in self._table_layers], ids, kernel_comb)
        result = {}
        for t, feats in enumerate(per_table):
            dim = self._table_configs[t].embedding_dim
            parts = [outs[t]] if rows[t] is None else tf.split(outs[t], tf.stack(rows[t]), num=len(feats))
            for (path, _, lead, _), out in zip(feats, parts):
                result[path] = _reshape(out, lead, dim)
        return result

    def _xla_call(self, per_table, where):
        """The lookup (and the fused optimizers in its backward) as XLA-compilable ops: one
        gather + segment sum per feature; the tables with a fused optimizer in one custom
        gradient whose backward applies `xla.apply_rows` per table."""
        _xla.log_xla_once(where)
        if self._sharding is not None:
            raise ValueError(f"{where}: sharding={self._sharding!r} cannot be compiled with XLA (its lookup is "
                             "a collective of embedlab.sok's custom ops); call it without jit_compile=True")
        result, fused = {}, []   # fused: (table, path, lead, rows, keys, scales, nrows)
        for t, feats in enumerate(per_table):
            table = _lookup.as_variable(self._table_layers[t].embeddings)
            for path, si, lead, comb in feats:
                rows, keys, w, nrows = _xla.flat_ids(si)
                scales = _xla.entry_scales(keys, w, rows, nrows, comb)
                if self._table_optimizer[t] is None:
                    out = _xla.pool(lambda k, table=table: tf.gather(table, k), rows, keys, scales, nrows)
                    result[path] = _reshape(out, lead, self._table_configs[t].embedding_dim)
                else:
                    fused.append((t, path, lead, rows, keys, scales, nrows))
        if not fused:
            return result
        used = sorted({e[0] for e in fused})
        pos = {t: i for i, t in enumerate(used)}
        tables = [self._table_layers[t].embeddings for t in used]
        variables = [_lookup.as_variable(v) for v in tables]
        for g, opt in enumerate(self._optimizers):
            if not opt.built:   # as training_lookup builds it: on all the tables of its group
                opt.build([layer.embeddings for layer, o in zip(self._table_layers, self._table_optimizer) if o == g])

        @tf.custom_gradient
        def lookup(trigger, *handles):
            outs = [_xla.pool(lambda k, h=handles[pos[t]]: resource_variable_ops.resource_gather(h, k, dtype=tf.float32),
                              rows, keys, scales, nrows)
                    for t, _, _, rows, keys, scales, nrows in fused]

            def grad(*dys):
                keys_of, grads_of = {}, {}
                for (t, _, _, rows, keys, scales, _), out, dy in zip(fused, outs, dys):
                    dy = tf.zeros_like(out) if dy is None else dy
                    keys_of.setdefault(t, []).append(keys)
                    grads_of.setdefault(t, []).append(tf.gather(dy, rows) * scales[:, None])
                for g, opt in enumerate(self._optimizers):
                    ts = [t for t in used if self._table_optimizer[t] == g]
                    if not ts:
                        continue
                    applied = [_xla.apply_rows(opt, tables[pos[t]], tf.concat(keys_of[t], 0),
                                               tf.concat(grads_of[t], 0)) for t in ts]
                    with tf.control_dependencies(applied):
                        opt.iterations.assign_add(1)
                return [tf.zeros_like(trigger)] + [None] * len(handles)

            return outs, grad

        outs = lookup(tf.convert_to_tensor(_lookup.as_variable(self.bp_trigger)), *[v.handle for v in variables])
        for (t, path, lead, *_), out in zip(fused, outs):
            result[path] = _reshape(out, lead, self._table_configs[t].embedding_dim)
        return result

    # ---- tables ---------------------------------------------------------------------------

    def _default_device_get_embedding_tables(self):
        if self._sharding is not None:
            # Every worker gathers every table (a collective: call it on all workers).
            from ..sok import gather
            return {name: gather(v)[1] for name, v in self.shards.items()}
        return {t.name: layer.embeddings.value for t, layer in zip(self._table_configs, self._table_layers)}

    @property
    def table_optimizers(self) -> dict:
        """Table name -> the `embedlab.optimizers` instance that trains it (None for the model's;
        with sharding, the instance inside the `sok.OptimizerWrapper` that holds the shards' state)."""
        opts = self._optimizers if self._sharding is None else [w.optimizer for w in self._shard_optimizers]
        return {t.name: None if g is None else opts[g]
                for t, g in zip(self._table_configs, self._table_optimizer)}

    def export_hps(self, path) -> dict:
        """Writes every table as an HPS sparse model (`key` / `emb_vector`, keys 0..rows-1), one
        folder per table under `path`, each written atomically by `embedlab.sparse_model`.

        Args:
            path: the parent folder (created).

        Returns:
            dict table name -> folder `Path`.

        Example:
            >>> folders = layer.export_hps("hps_model")   # doctest: +SKIP
            >>> sorted(folders)                            # doctest: +SKIP
            ['t']
        """
        from ..sparse_model import write_sparse_model

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        out = {}
        for name, table in self.get_embedding_tables().items():
            values = np.asarray(table)
            out[name] = write_sparse_model(path / name, np.arange(values.shape[0], dtype=np.int64), values)
        return out

    # ---- Keras state and serialization ----------------------------------------------------

    @property
    def variables(self):
        """The layer's variables and its fused optimizers' state (which is not weights)."""
        # The fused optimizers' state (step counters, slots) is captured by the backward that
        # applies it: whatever collects a model's state through `variables` (model.export's
        # SavedModel) must find it here. It is not a weight of the layer.
        vs = super().variables
        seen = {id(v) for v in vs}
        for opt in (self._optimizers if self._sharding is None else []):
            vs = vs + [v for v in opt.variables if id(v) not in seen]
        return vs

    def save_own_variables(self, store):
        if self._sharding is not None:
            raise ValueError(f"DistributedEmbedding {self.name!r}: a row-sharded layer is not saved in .keras files "
                             "(each worker holds other rows); save it with embedlab.sok.dump(path, "
                             "list(layer.shards.values())) or export_hps(path)")
        # The tables are saved by their sub-layers; here the trigger and the fused optimizers'
        # state (counters and slots, in each optimizer's variable order).
        if self._optimizers:
            store["bp_trigger"] = np.asarray(self.bp_trigger.numpy())
        for g, opt in enumerate(self._optimizers):
            for j, v in enumerate(opt.variables):
                store[f"optimizer_{g}/{j}"] = np.asarray(v.numpy())

    def load_own_variables(self, store):
        if self._optimizers and "bp_trigger" in store:
            self.bp_trigger.assign(np.asarray(store["bp_trigger"]))
        for g, opt in enumerate(self._optimizers):
            saved = [k for k in store.keys() if k.startswith(f"optimizer_{g}/")]
            if not saved:
                continue
            if len(saved) != len(opt.variables):
                raise ValueError(f"DistributedEmbedding {self.name!r}: the saved state of optimizer {g} has "
                                 f"{len(saved)} variables, this layer's has {len(opt.variables)}")
            for j, v in enumerate(opt.variables):
                value = np.asarray(store[f"optimizer_{g}/{j}"])
                if tuple(value.shape) != tuple(v.shape):
                    raise ValueError(f"DistributedEmbedding {self.name!r}: saved optimizer {g} variable {j} has "
                                     f"shape {value.shape}, expected {tuple(v.shape)}")
                v.assign(value)

    def get_config(self):
        config = super().get_config()
        config["optimizer_in_backward"] = self._optimizer_in_backward
        config["sharding"] = self._sharding
        return config


def _concat(parts, mixed, weighted):
    """Several features' SparseInputs (of one table) as one CSR SparseInput, rows in order,
    with weights (1 where a feature has none) when `weighted`. With `mixed` (some features
    pooled "sum", some "mean"), the mean rows get weights w / sum(w)."""
    splits, keys, wts, offset = [], [], [], tf.constant(0, tf.int64)
    for i, (si, comb) in enumerate(parts):
        s, k = si.row_splits, si.keys
        splits.append((s if i == 0 else s[1:]) + offset)
        offset = offset + s[-1]
        keys.append(k)
        if weighted:
            w = si.weights if si.has_weights else tf.ones_like(k, tf.float32)
            if mixed and comb == "mean":
                rows = tf.ragged.row_splits_to_segment_ids(s)
                w = tf.where(k >= 0, w, tf.zeros_like(w))
                total = tf.math.unsorted_segment_sum(w, rows, tf.shape(s, out_type=tf.int64)[0] - 1)
                w = tf.math.divide_no_nan(w, tf.gather(total, rows))
            wts.append(w)
    return SparseInput.from_row_splits(tf.concat(splits, 0), tf.concat(keys, 0),
                                       tf.concat(wts, 0) if weighted else None)
