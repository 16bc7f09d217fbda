"""Key translation, the pipeline stage between the training reader and the compiled step: the
keys of a batch become rows of the embeddings' working tables.

`KeyTranslation(embeddings, data)` is handed to the training `DataReader` as its `stage`: the
reader's background thread runs it on every batch before queueing it, so the step only sees
row indices and the hash-table inserts overlap the previous step. It records, on the batch
(`batch.extra`), the rows of every embedding and the tables' generations it translated against,
or the `KeyError_` that refused the batch (a key the tables cannot place; nothing inserted).

A keyset switch (`ModelOversubscriber.update`) reloads the tables and moves their generation
on, so a batch translated ahead of it holds rows of the previous pass: `stale(batch)` says so,
and the reader runs the stage again on that batch when it hands it over (`DataReader.next_batch`).
Evaluation keys are only looked up, never inserted (`eval_rows`), when the evaluation batch is
taken.
"""
from __future__ import annotations

from .embedding import KeyError_

__all__ = ["KeyTranslation"]


class KeyTranslation:
    """Translates the keys of a batch into table rows for each embedding (see the module docstring).

    Args:
        embeddings: the Session's `Embedding` objects.
        data: the Data layer (`DataSpec`): which of the batch's sparse inputs feeds each embedding.
    """

    def __init__(self, embeddings, data):
        self.embeddings = list(embeddings)
        pos = {s.top: i for i, s in enumerate(data.sparse)}
        self._inputs = [pos[e.spec.bottom] for e in self.embeddings]

    def inputs(self, batch) -> list:
        """(row_splits, keys) of each embedding's sparse input in `batch`."""
        return [batch.sparse[i] for i in self._inputs]

    def generations(self) -> list:
        return [e.generation for e in self.embeddings]

    def __call__(self, batch):
        """Translates `batch`'s training keys (inserting new keys) and records the result on it."""
        gens = self.generations()
        try:
            rows = [e.translate_train(sp[0], sp[1], batch) for e, sp in zip(self.embeddings, self.inputs(batch))]
            batch.extra = {"gens": gens, "rows": rows}
        except KeyError_ as err:
            # Kept on the batch until train() raises it, so without its traceback: the reader
            # thread's frames in it (whole file blocks among their locals) and the batch would
            # form a reference cycle that only Python's cyclic collector frees, much later.
            batch.extra = {"gens": gens, "error": err.with_traceback(None)}
        return batch

    def stale(self, batch) -> bool:
        """True when `batch` was not translated, or was translated before a keyset switch."""
        return not batch.extra or batch.extra.get("gens") != self.generations()

    @staticmethod
    def rows(batch) -> list:
        """The rows recorded on a translated batch, one array per embedding; raises the
        `KeyError_` that refused it."""
        if "error" in batch.extra:
            raise batch.extra["error"]
        return batch.extra["rows"]

    def eval_rows(self, batch) -> list:
        """Rows of an evaluation batch's keys, -1 for keys the working tables do not hold (or
        have not initialized yet); nothing is inserted."""
        return [e.translate_eval(keys) for e, (_, keys) in zip(self.embeddings, self.inputs(batch))]
