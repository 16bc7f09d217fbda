"""Session memory: what a pass switch leaves behind. A batch that the reader thread translated
against the previous keyset carries its KeyError_ until `train()` translates it again; that
error must not tie the batch (and the reader's file blocks) into a reference cycle, which only
Python's cyclic collector would free, long after."""
from __future__ import annotations

import gc
import time

from embedlab.session import Session, solver_parser_helper
from embedlab.session.reader import Batch

from sessionlib import dump, wdl_json, write_lists


def test_a_batch_translated_before_the_switch_leaves_no_garbage_cycle(tmp_path, rng):
    lists, keysets, _ = write_lists(tmp_path / "d", rng, [(1, 2), (4, 1)], n_lists=2, files_per_list=2,
                                    per_file=64, vocab=30)
    js = dump(tmp_path / "m.json", wdl_json(capacity=400, hidden=8))
    sess = Session(solver_parser_helper(batchsize=32), js, True, str(tmp_path / "store"))
    reader = sess.get_data_reader_train()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for i, (fl, ks) in enumerate(zip(lists, keysets)):
            reader.set_file_list_source(fl)            # HugeCTR's order: the source, then the keyset
            t0 = time.monotonic()
            while reader._q.empty() and time.monotonic() - t0 < 30:
                time.sleep(0.005)                      # a batch is translated before update()
            first = reader._q.queue[0]
            if i == 0:                                 # no keyset loaded yet: that batch holds an error
                assert isinstance(first, Batch) and "error" in first.extra, first.extra
            sess.get_model_oversubscriber().update(ks)
            n = 0
            while sess.train():
                n += 1
            assert n == 4
        del first
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if isinstance(o, (Batch, BaseException))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == [], left
