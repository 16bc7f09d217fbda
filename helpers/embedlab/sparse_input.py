"""`SparseInput`: the one sparse-input type every lookup path takes.

A batch of variable-length key lists (one list per row: a sample, or a sample's slot) as CSR:
`row_splits` (int64 `[rows + 1]`), `keys` (int64 `[nnz]`, -1 = no key, 0 is a valid key) and
optional per-key float32 `weights` (`[nnz]`); the role TorchRec's KeyedJaggedTensor plays for
one feature. It is made once from whatever the caller has (a dense tensor padded with -1, a
`tf.RaggedTensor`, a `tf.SparseTensor`, or CSR tensors) and then handed to
`embedlab.ops.fused_embedding_lookup`, `embedlab.plugin.EmbeddingLayer` or
`embedlab.sok.lookup_sparse`.

A `SparseInput` made from a SparseTensor keeps its COO form until something asks for the CSR
(`row_splits` / `keys` / `weights`): a lookup of CPU tables hands the COO straight to the fused
op that sorts and looks up in one pass (`EmbedLabFusedResourceSparseLookup`), so no separate
conversion runs. `as_csr` converts many at once, all the COO among them in one op.

Example:
    >>> import tensorflow as tf
    >>> x = SparseInput.from_dense(tf.constant([[3, 1], [-1, -1], [7, -1]], tf.int64))
    >>> x.row_splits.numpy().tolist(), x.keys.numpy().tolist()
    ([0, 2, 4, 6], [3, 1, -1, -1, 7, -1])
    >>> y = SparseInput.from_ragged(tf.ragged.constant([[3, 1], [], [7]], dtype=tf.int64))
    >>> int(y.batch_size), y.keys.numpy().tolist()
    (3, [3, 1, 7])
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from . import _native

__all__ = ["SparseInput", "as_csr"]


def is_dtype(dtype, expected) -> bool:
    """dtype == expected, answered by identity first: TensorFlow hands out one DType object per
    type, and DType.__eq__ (Python) is slow enough to matter to an eager call that checks 26
    tables a hundred times.

    Example:
        >>> is_dtype(tf.float32, tf.float32), is_dtype(tf.int64, tf.float32)
        (True, False)
    """
    return dtype is expected or dtype == expected


def _keys(keys, where: str, arg: str = "ids") -> tf.Tensor:
    dtype = keys.dtype
    if is_dtype(dtype, tf.int64):
        return keys
    if is_dtype(dtype, tf.int32):  # lossless; everything inside is int64
        return tf.cast(keys, tf.int64)
    raise ValueError(f"{where}: {arg} must be int64 (or int32) keys, got {dtype.name}")


def _weights(w, where: str) -> tf.Tensor:
    if not is_dtype(w.dtype, tf.float32):
        raise ValueError(f"{where}: weights must be float32, got {w.dtype.name}")
    return w


def _assert_same(a, b, where, name_a, name_b):
    """Eager: raise ValueError if a != b. In a graph: an assertion (InvalidArgumentError)."""
    if tf.executing_eagerly():
        if a.shape != b.shape or not bool(tf.reduce_all(tf.equal(a, b))):
            raise ValueError(f"{where}: {name_a} differ from {name_b}; weights must be shaped like ids")
    else:
        tf.debugging.assert_equal(a, b, message=f"{where}: {name_a} differ from {name_b}; "
                                  "weights must be shaped like ids")


class SparseInput:
    """Keys of a batch of rows in CSR form (row splits, keys, optional weights).

    Make one with a `from_*` constructor (or `from_any`); don't call the constructor with
    COO arguments yourself. Shapes are checked when made; key values are checked by the op
    that reads them (against the table's rows).

    Attributes:
        row_splits: int64 `[rows + 1]`, non-decreasing from 0 to `nnz`.
        keys: int64 `[nnz]`; -1 is skipped by every lookup.
        weights: float32 `[nnz]` or None.

    `batch_size` (below) is the number of rows.

    Example:
        >>> sp = tf.SparseTensor([[0, 0], [0, 1], [2, 0]], tf.constant([3, 1, 7], tf.int64), [3, 2])
        >>> x = SparseInput.from_sparse(sp)
        >>> x.is_coo, x.row_splits.numpy().tolist(), x.keys.numpy().tolist()
        (True, [0, 2, 2, 3], [3, 1, 7])
    """

    __slots__ = ("_splits", "_keys", "_weights", "_coo")

    def __init__(self, row_splits, keys, weights=None, *, where: str = "embedlab.SparseInput"):
        row_splits = tf.convert_to_tensor(row_splits)
        keys = _keys(tf.convert_to_tensor(keys), where, "keys")
        if not is_dtype(row_splits.dtype, tf.int64):
            if not is_dtype(row_splits.dtype, tf.int32):
                raise ValueError(f"{where}: row_splits must be int64 (or int32), got {row_splits.dtype.name}")
            row_splits = tf.cast(row_splits, tf.int64)
        if row_splits.shape.rank not in (None, 1) or keys.shape.rank not in (None, 1):
            raise ValueError(f"{where}: row_splits and keys must be 1-D, got shapes {row_splits.shape} "
                             f"and {keys.shape}")
        if row_splits.shape.rank == 1 and row_splits.shape[0] == 0:
            raise ValueError(f"{where}: row_splits must hold rows + 1 >= 1 offsets, got an empty tensor")
        if weights is not None:
            weights = _weights(tf.convert_to_tensor(weights), where)
            if weights.shape.rank not in (None, 1):
                raise ValueError(f"{where}: weights must be 1-D like keys, got shape {weights.shape}")
            if weights.shape.is_fully_defined() and keys.shape.is_fully_defined() and \
                    weights.shape[0] != keys.shape[0]:
                raise ValueError(f"{where}: weights hold {weights.shape[0]} values but keys hold "
                                 f"{keys.shape[0]}; weights must be shaped like keys")
        self._splits, self._keys, self._weights, self._coo = row_splits, keys, weights, None

    # ---- constructors ---------------------------------------------------------------------

    @classmethod
    def from_row_splits(cls, row_splits, keys, weights=None, *, where: str = "embedlab.SparseInput.from_row_splits"):
        """From CSR tensors: `row_splits [rows + 1]`, `keys [nnz]`, optional `weights [nnz]`.

        Example:
            >>> SparseInput.from_row_splits([0, 2, 3], tf.constant([5, 6, 7], tf.int64)).batch_size.numpy()
            2
        """
        return cls(row_splits, keys, weights, where=where)

    @classmethod
    def from_dense(cls, ids, weights=None, *, where: str = "embedlab.SparseInput.from_dense"):
        """From a dense `[batch, max_nnz]` key tensor padded with -1 (or `[batch]`: one key per row).

        Args:
            ids: int64 (or int32) keys; -1 is padding, 0 a valid key.
            weights: None, or float32 shaped like `ids`.

        Returns:
            A `SparseInput` with `batch` rows of `max_nnz` keys each (the padding stays in
            place: every lookup skips -1).

        Example:
            >>> SparseInput.from_dense([[4, -1], [0, 2]]).keys.numpy().tolist()
            [4, -1, 0, 2]
        """
        if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
            raise ValueError(f"{where}: ids must be a dense tensor, got {type(ids).__name__} "
                             "(use from_ragged / from_sparse)")
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank == 1:
            ids = ids[:, None]
        if ids.shape.rank != 2:
            raise ValueError(f"{where}: dense ids must be [batch, max_nnz] padded with -1, got shape {ids.shape}")
        keys2d = _keys(ids, where)
        shape = tf.shape(keys2d, out_type=tf.int64)
        splits = tf.range(shape[0] + 1, dtype=tf.int64) * shape[1]
        w = None
        if weights is not None:
            if isinstance(weights, (tf.RaggedTensor, tf.SparseTensor)):
                raise ValueError(f"{where}: weights must be dense like ids, got {type(weights).__name__}")
            weights = tf.convert_to_tensor(weights)
            if weights.shape.rank == 1:
                weights = weights[:, None]
            if weights.shape.is_fully_defined() and keys2d.shape.is_fully_defined() and weights.shape != keys2d.shape:
                raise ValueError(f"{where}: weights shape {weights.shape} differs from ids shape {keys2d.shape}")
            w = tf.reshape(_weights(weights, where), [-1])
        x = cls.__new__(cls)
        x._splits, x._keys, x._weights, x._coo = splits, tf.reshape(keys2d, [-1]), w, None
        return x

    @classmethod
    def from_ragged(cls, ids, weights=None, *, where: str = "embedlab.SparseInput.from_ragged"):
        """From a `tf.RaggedTensor [batch, None]` of keys (and weights ragged like it).

        Example:
            >>> SparseInput.from_ragged(tf.ragged.constant([[1], [], [2, 2]], tf.int64)).row_splits.numpy().tolist()
            [0, 1, 1, 3]
        """
        if not isinstance(ids, tf.RaggedTensor):
            raise ValueError(f"{where}: ids must be a tf.RaggedTensor, got {type(ids).__name__}")
        if ids.ragged_rank != 1:
            raise ValueError(f"{where}: ragged ids must have shape [batch, None] (ragged_rank 1), "
                             f"got ragged_rank {ids.ragged_rank}")
        keys = _keys(ids.values, where)
        splits = ids.row_splits
        if not is_dtype(splits.dtype, tf.int64):
            splits = tf.cast(splits, tf.int64)
        w = None
        if weights is not None:
            if not isinstance(weights, tf.RaggedTensor):
                raise ValueError(f"{where}: weights must be a RaggedTensor like ids, got {type(weights).__name__}")
            w = _weights(weights.values, where)
            _assert_same(tf.cast(weights.row_splits, tf.int64), splits, where, "weights.row_splits", "ids.row_splits")
        x = cls.__new__(cls)
        x._splits, x._keys, x._weights, x._coo = splits, keys, w, None
        return x

    @classmethod
    def from_sparse(cls, ids, weights=None, *, where: str = "embedlab.SparseInput.from_sparse"):
        """From a COO `tf.SparseTensor [batch, max_nnz]` of keys (and weights with the same indices).

        Entries may come in any order (a stable counting sort puts them in row order, keeping
        each row's order). The CSR is made on first use of `row_splits` / `keys` / `weights`,
        or not at all when a lookup of CPU tables reads the COO directly.

        Example:
            >>> sp = tf.SparseTensor([[1, 0], [0, 0]], tf.constant([9, 8], tf.int64), [2, 3])
            >>> SparseInput.from_sparse(sp).keys.numpy().tolist()
            [8, 9]
        """
        if not isinstance(ids, tf.SparseTensor):
            raise ValueError(f"{where}: ids must be a tf.SparseTensor, got {type(ids).__name__}")
        if ids.shape.rank not in (None, 2):
            raise ValueError(f"{where}: SparseTensor ids must be [batch, max_nnz], got rank {ids.shape.rank}")
        keys = _keys(ids.values, where)
        w = None
        if weights is not None:
            if not isinstance(weights, tf.SparseTensor):
                raise ValueError(f"{where}: weights must be a SparseTensor like ids, got {type(weights).__name__}")
            _assert_same(weights.indices, ids.indices, where, "weights.indices", "ids.indices")
            w = _weights(weights.values, where)
        x = cls.__new__(cls)
        x._splits = x._keys = x._weights = None
        x._coo = (ids.indices, keys, ids.dense_shape, w)
        return x

    @classmethod
    def from_any(cls, ids, weights=None, *, where: str = "embedlab.SparseInput"):
        """A `SparseInput` from any accepted form: a `SparseInput` (returned as is; its weights
        travel inside it, so `weights` must be None), a RaggedTensor, a SparseTensor or a dense
        tensor (anything `tf.convert_to_tensor` takes) padded with -1.

        Example:
            >>> SparseInput.from_any([[1, -1]]).keys.numpy().tolist()
            [1, -1]
        """
        if isinstance(ids, SparseInput):
            if weights is not None:
                raise ValueError(f"{where}: ids is a SparseInput, which carries its own weights; pass weights=None "
                                 "(or make the SparseInput with the weights)")
            return ids
        if isinstance(ids, tf.RaggedTensor):
            return cls.from_ragged(ids, weights, where=where)
        if isinstance(ids, tf.SparseTensor):
            return cls.from_sparse(ids, weights, where=where)
        return cls.from_dense(ids, weights, where=where)

    # ---- views ------------------------------------------------------------------------------

    @property
    def is_coo(self) -> bool:
        """True while the input is still in the COO form it was made from (no CSR made yet)."""
        return self._splits is None

    @property
    def coo(self):
        """`(indices, keys, dense_shape, weights or None)` of a SparseTensor-made input, else None."""
        return self._coo

    @property
    def has_weights(self) -> bool:
        return (self._coo[3] if self._splits is None else self._weights) is not None

    @property
    def values(self) -> tf.Tensor:
        """The keys in whatever order the input holds them (COO order before conversion), for
        checks over all keys that need no row structure, without converting."""
        return self._coo[1] if self._splits is None else self._keys

    def _convert(self):
        if self._splits is None:
            as_csr([self])

    @property
    def row_splits(self) -> tf.Tensor:
        self._convert()
        return self._splits

    @property
    def keys(self) -> tf.Tensor:
        self._convert()
        return self._keys

    @property
    def weights(self):
        self._convert()
        return self._weights

    @property
    def batch_size(self) -> tf.Tensor:
        """The number of rows, an int64 scalar tensor."""
        if self._splits is None:
            return self._coo[2][0]
        return tf.shape(self._splits, out_type=tf.int64)[0] - 1

    def to_ragged(self) -> tf.RaggedTensor:
        """The keys as a `tf.RaggedTensor [rows, None]` (no copy, no validation)."""
        return tf.RaggedTensor.from_row_splits(self.keys, self.row_splits, validate=False)

    def __repr__(self):
        form = "COO" if self._splits is None else "CSR"
        return f"SparseInput({form}, keys={self.values!r}, weighted={self.has_weights})"


def as_csr(inputs: Sequence[SparseInput]) -> list:
    """The CSR `(row_splits, keys, weights or None)` of each input; all the inputs still in
    COO form are converted together by one `EmbedLabSparseToCsr` op (and keep the result).

    Args:
        inputs: a list of `SparseInput`.

    Returns:
        A list of `(row_splits, keys, weights)` tuples, one per input.

    Example:
        >>> sp = tf.SparseTensor([[1, 0]], tf.constant([9], tf.int64), [2, 1])
        >>> [k.numpy().tolist() for _, k, _ in as_csr([SparseInput.from_sparse(sp), SparseInput.from_dense([[4]])])]
        [[9], [4]]
    """
    coo = [x for x in inputs if x._splits is None]
    if coo:
        weighted = [x._coo[3] is not None for x in coo]
        if any(weighted) and not all(weighted):
            raise ValueError("embedlab.sparse_input.as_csr: weights must be given for all SparseTensor inputs "
                             "converted together, or for none")
        splits, keys, w_out = _native.tf_ops().embed_lab_sparse_to_csr(
            [x._coo[0] for x in coo], [x._coo[1] for x in coo], [x._coo[2] for x in coo],
            [x._coo[3] for x in coo] if weighted[0] else [])
        for t, x in enumerate(coo):
            x._splits, x._keys, x._weights = splits[t], keys[t], (w_out[t] if w_out else None)
    return [(x._splits, x._keys, x._weights) for x in inputs]
