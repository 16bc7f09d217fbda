"""The GPU tier's request path of the :class:`~embedlab.hps.ParameterServer`.

One request (one table, a list or dict of tables, or every table's keys in one flat array with
``sizes``) goes through one routine: the keys of every table as one device array, one output
buffer on the device, one call of ``CudaCacheLookup`` (every table's cache lookup enqueued on
the current stream, one host synchronization), then, only where there were misses, the tiers
below and the cache inserts. The all-hits path does a constant amount of Python work per
request plus a few attribute reads per table: what is fixed for a model (its tables, their
caches, names and dims) is looked up once into a ``_Plan``, the output layout of a
request shape (offsets, runs of equal-width tables) is kept per shape, and keys and rows cross
DLPack once per request. Keys or arguments that are not the common case (another framework
than the backend's, int32 keys, mixed host and device keys, bad input) take the general
branch, which checks each table's keys and raises the errors documented on
:meth:`~embedlab.hps.ParameterServer.lookup`.

No TensorFlow here (the server runs without it).
"""
from __future__ import annotations

import operator
import time

import numpy as np

from .tiers import DeviceArrays, GpuCacheTier

__all__ = ["GpuPath"]

_I64 = np.dtype(np.int64)
_dtype = operator.attrgetter("dtype")
_LAYOUTS_KEPT = 256      # output layouts kept per plan (one per request shape seen)


class _Layout:
    """Where each table's rows go in a request's output buffer.

    ``offs[i]``: table i's first float; ``total``: the buffer's length; ``segs``: runs of
    consecutive tables of one width whose rows lie end to end, ``(start, end, dim, sizes)``, so
    that the per-table views of a run come from one reshape and one split."""
    __slots__ = ("offs", "total", "segs", "key_offs")

    def __init__(self, ns, dims, packed: bool):
        offs, segs, o, k, key_offs = [], [], 0, 0, []
        for n, d in zip(ns, dims):
            offs.append(o)
            key_offs.append(k)
            k += n
            if segs and segs[-1][2] == d and segs[-1][1] == o:
                segs[-1][1] = o + n * d
                segs[-1][3].append(n)
            else:
                segs.append([o, o + n * d, d, [n]])
            # Table i's rows start at a multiple of 4 floats (16 bytes: the kernels' wide
            # copies) unless the caller asked for the rows end to end (``sizes=``).
            o += n * d if packed else (n * d + 3) // 4 * 4
        self.offs, self.total, self.segs, self.key_offs = offs, o, [tuple(s) for s in segs], key_offs


class _Plan:
    """What a request for a fixed list of tables of one model needs, looked up once: the tables,
    their names, widths and, per deployed device, the cache tier and its raw caches."""
    __slots__ = ("tabs", "names", "dims", "gpu", "devices", "caches", "layouts", "model")

    def __init__(self, tabs: list):
        self.tabs = tabs
        self.model = tabs[0].model if tabs else None
        self.names = [t.name for t in tabs]
        self.dims = [t.dim for t in tabs]
        self.gpu = bool(tabs) and all(t.cache_tier == "gpu" for t in tabs)
        self.devices = tabs[0].devices if self.gpu else ()
        self.caches: dict[int, tuple[GpuCacheTier, list]] = {}
        if self.gpu:
            for d, tier in tabs[0].gpu.items():
                self.caches[d] = (tier, tier.raw_caches(self.names))
        self.layouts: dict = {}

    def layout(self, ns: list, packed: bool) -> _Layout:
        key = (tuple(ns), packed)
        lay = self.layouts.get(key)
        if lay is None:
            if len(self.layouts) >= _LAYOUTS_KEPT:
                self.layouts.clear()
            lay = self.layouts[key] = _Layout(ns, self.dims, packed)
        return lay


def device_index(device, error) -> int:
    """A CUDA device ordinal from an int, "cuda:N" / "gpu:N" / "N", a torch.device or a CuPy Device."""
    if isinstance(device, (int, np.integer)) and not isinstance(device, bool):
        return int(device)
    if isinstance(device, str):
        s = device.strip().lower()
        for p in ("cuda:", "gpu:", "/gpu:", "/device:gpu:"):
            if s.startswith(p):
                s = s[len(p):]
        if s.isdigit():
            return int(s)
    idx = getattr(device, "index", None)
    if getattr(device, "type", None) == "cuda" and idx is not None:
        return int(idx)
    if type(device).__module__.startswith("cupy") and hasattr(device, "id"):
        return int(device.id)
    raise error(f"HPS: device must be a CUDA device ordinal (0, 'cuda:0', a torch.device), got {device!r}")


class GpuPath:
    """The GPU tier's lookups, cache inserts and device keys for one :class:`~embedlab.hps.ParameterServer`
    (its counters, lock, epoch and lower tiers are the server's).

    Args:
        ps: the server.

    Example:
        >>> gp = ParameterServer(cfg)._gpu                                    # doctest: +SKIP
        >>> rows, _ = gp.lookup_many_list(gp.plan_list("m", 2), [k0, k1], 0, False)  # doctest: +SKIP
    """

    def __init__(self, ps):
        from .server import HPSLookupError
        self.ps = ps
        self._error = HPSLookupError
        self._plans: dict = {}

    def close(self) -> None:
        """Drops the plans (they hold the caches' objects)."""
        self._plans.clear()

    # ---- plans --------------------------------------------------------------------------------
    def plan(self, model, ids) -> _Plan:
        """The plan of tables ``ids`` of ``model`` (kept when the ids are plain ints; checked by
        the server's ``_table``, whose errors name a bad model or table id)."""
        key = (model, ids) if type(model) is str and all(type(i) is int for i in ids) else None
        p = self._plans.get(key) if key is not None else None
        if p is None:
            p = _Plan([self.ps._table(model, i) for i in ids])
            if key is not None and p.gpu:
                self._plans[key] = p
        return p

    def plan_list(self, model, n: int) -> _Plan:
        """The plan of tables 0..n-1 of ``model`` (``lookup_many``'s list form)."""
        p = self._plans.get((model, n)) if type(model) is str else None
        if p is None:
            p = _Plan([self.ps._table(model, i) for i in range(n)])
            if p.gpu:
                self._plans[(model, n)] = p
        return p

    def plan_all(self, model) -> _Plan:
        """The plan of every table of ``model`` (``lookup_many``'s ``sizes`` form)."""
        p = self._plans.get((model, "all")) if type(model) is str else None
        if p is None:
            n = sum(1 for m, _ in self.ps._tables if m == model) if type(model) is str else 0
            if not n:
                self.ps._table(model, 0)        # raises: not a str, or an unknown model
            p = _Plan([self.ps._table(model, i) for i in range(n)])
            if p.gpu:
                self._plans[(model, "all")] = p
        return p

    # ---- entry points ---------------------------------------------------------------------------
    def lookup_one(self, tab, keys, fw: str, device, return_defaulted: bool):
        """``ParameterServer.lookup`` of a table on the GPU tier (a one-table request)."""
        p = self.plan(tab.model, (tab.index,))
        xp = self.ps._xp
        fast = self._fast_keys(xp, [keys]) if fw in ("", xp.name) else None
        if fast is not None and fast[1][0]:     # (no keys: the general branch answers, uncounted)
            flat, ns, kfw, kd = fast
            d = self._device_for(p, kd, device)
            if d is not None:
                rows, flags = self._serve(p, flat, ns, d, kfw, device, return_defaulted, packed=False)
                return (rows[0], flags[0]) if return_defaulted else rows[0]
        rows, flags = self.request(p, [keys], [fw], device, return_defaulted, single=True)
        return (rows[0], flags[0]) if return_defaulted else rows[0]

    def lookup_many_list(self, p: _Plan, keys: list, device, return_defaulted: bool):
        """``lookup_many`` of the tables of plan ``p`` (GPU tier), one key array each: the fast
        branch when every table's keys are the backend's int64 device arrays or int64 NumPy
        arrays, else the general one. Returns ``(rows, flags or None)`` as lists."""
        xp = self.ps._xp
        fast = self._fast_keys(xp, keys)
        if fast is not None:
            flat, ns, fw, kd = fast
            d = self._device_for(p, kd, device)
            if d is not None:
                return self._serve(p, flat, ns, d, fw, device, return_defaulted, packed=False)
        fws = [DeviceArrays.framework(k) for k in keys]
        return self.request(p, keys, fws, device, return_defaulted, single=False)

    def lookup_flat(self, p: _Plan, keys, sizes, device, return_defaulted: bool):
        """``lookup_many(..., sizes=)`` on the GPU tier: every table's keys end to end in one
        array, every table's rows end to end in one float32 array (``[sizes[i], dim_i]`` each,
        no gaps); with ``return_defaulted`` one bool array over all keys."""
        ps, xp = self.ps, self.ps._xp
        fw = DeviceArrays.framework(keys)
        if fw:
            k = self.device_keys(xp, keys)
            kd = xp.device_of(k)
            if device is not None and device_index(device, self._error) != kd:
                raise self._error(f"HPS: keys are on cuda:{kd} but device is cuda:"
                                  f"{device_index(device, self._error)}; move them first")
        else:
            k = ps._keys(keys)
            kd = None
        ns = self.check_sizes(p, sizes, int(k.shape[0]))
        d = self._device_for(p, kd, device)
        if d is None:
            self._undeployed(p, kd if device is None else device_index(device, self._error))
        rows, flags = self._serve(p, k, ns, d, fw, device, return_defaulted, packed=True, flat_out=True)
        return (rows, flags) if return_defaulted else rows

    def check_sizes(self, p: _Plan, sizes, nkeys: int) -> list:
        """``sizes`` as a list of ints: one count >= 0 per table of the request, summing to the
        number of keys."""
        if type(sizes) is list and set(map(type, sizes)) == {int}:      # the common form, checked in Python
            if len(sizes) == len(p.tabs) and min(sizes) >= 0 and sum(sizes) == nkeys:
                return sizes
        elif type(sizes) is list and not sizes and not p.tabs and nkeys == 0:
            return sizes
        try:
            s = np.asarray(sizes)
        except Exception as e:  # noqa: BLE001 (reported with the argument's name)
            raise self._error(f"HPS: sizes must be host integers (a list or NumPy array), got {sizes!r}: {e}")
        if s.dtype.kind not in "iu" or s.ndim != 1:
            raise self._error(f"HPS: sizes must be a 1-D sequence of integers, got dtype {s.dtype} shape {s.shape}")
        if s.shape[0] != len(p.tabs):
            raise self._error(f"HPS: sizes must have one entry per table of model {p.model!r} "
                              f"({len(p.tabs)}), got {s.shape[0]}")
        if s.size and int(s.min()) < 0:
            raise self._error(f"HPS: sizes must be >= 0, got {s.tolist()}")
        if int(s.sum()) != nkeys:
            raise self._error(f"HPS: sizes sum to {int(s.sum())} but keys hold {nkeys} keys")
        return s.tolist()

    # ---- keys -------------------------------------------------------------------------------------
    def _fast_keys(self, xp, keys: list):
        """(flat device keys, sizes, framework, device) when every table's keys are int64 1-D
        arrays of the backend on one GPU (framework = the backend's), or int64 1-D NumPy arrays
        (framework "", device None, the flat keys still on the host); else None (the general
        branch then checks each table and raises what is wrong). One concatenation."""
        if not keys:
            return None
        k0 = keys[0]
        ps = self.ps
        # Per table only C-level maps (type, dtype, length); the concatenation then proves that
        # every table's keys are 1-D (a 0-d, or a 1-D next to a 2-D array, fails it; all 2-D
        # gives a 2-D result) and, for device arrays, that they are on one device.
        kind = type(k0)
        if kind is np.ndarray:
            if set(map(type, keys)) != {kind} or set(map(_dtype, keys)) != {_I64}:
                return None
            try:
                flat = np.concatenate(keys) if len(keys) > 1 else (
                    k0 if k0.flags.c_contiguous else np.ascontiguousarray(k0))      # (which makes a 0-d array 1-d)
            except Exception:  # noqa: BLE001 (0-d or mixed shapes: the general branch names them)
                return None
            if flat.ndim != 1:
                return None
            ns = list(map(len, keys))
            if not ps.config.supportlonglong and flat.size and (flat.min() < -2**31 or flat.max() >= 2**31):
                return None
            return flat, ns, "", None
        # (torch.int64 is the dtype of torch tensors only: one map checks type and dtype.)
        if kind is not xp.tensor_type:
            return None
        try:
            if set(map(_dtype, keys)) != {xp.int64} or (xp.name != "torch" and set(map(type, keys)) != {kind}):
                return None
            flat = xp.cat(keys) if len(keys) > 1 else (k0 if xp.contiguous(k0) else xp.as_int64_1d(k0))
        except Exception:  # noqa: BLE001 (keys on different devices, 0-d or mixed shapes: the general branch says so)
            return None
        if flat.ndim != 1:
            return None
        kd = xp.device_index_of(flat)
        if kd < 0:
            return None
        ns = list(map(xp.length, keys))
        if not ps.config.supportlonglong and flat.shape[0]:
            lo, hi = xp.min_max(flat)
            if lo < -2**31 or hi >= 2**31:
                return None
        return flat, ns, xp.name, kd

    def _device_for(self, p: _Plan, kd, device):
        """The device of a request (the keys', ``device``, or the first deployed one for host
        keys), or None when it is not deployed or differs from the keys'."""
        if device is None:
            d = p.devices[0] if kd is None else kd
        else:
            d = device if type(device) is int else device_index(device, self._error)
            if kd is not None and kd != d:
                return None
        return d if d in p.caches else None

    def _undeployed(self, p: _Plan, d):
        raise self._error(f"HPS: model {p.model!r} is deployed on GPU device(s) {list(p.devices)} "
                          f"(deployed_device_list); device {d} is not one of them")

    def device_keys(self, xp: DeviceArrays, keys):
        """GPU keys as this backend's contiguous int64 1-D array (checked)."""
        k = xp.import_array(keys)
        if xp.fast_keys(k):
            if self.ps.config.supportlonglong:
                return k
        dt = xp.dtype_name(k)
        if dt not in ("int64", "int32"):
            raise self._error(f"HPS: keys must be int64 (or int32), got dtype {dt}")
        if len(k.shape) != 1:
            raise self._error(f"HPS: keys must be 1-D, got shape {tuple(k.shape)}")
        k = xp.as_int64_1d(k)
        if not self.ps.config.supportlonglong and k.shape[0]:
            lo, hi = xp.min_max(k)
            if lo < -2**31 or hi >= 2**31:
                raise self._error("HPS: supportlonglong is false but keys hold values outside int32")
        return k

    # ---- the general branch -------------------------------------------------------------------------
    def request(self, p: _Plan, keys: list, fws: list, device, return_defaulted: bool, single: bool):
        """Any request of plan ``p``'s tables: each table's keys checked (host or device, any
        DLPack framework), then served as one. Returns ``(rows, flags or None)`` as lists."""
        ps, xp = self.ps, self.ps._xp
        tabs = p.tabs
        d = None if device is None else device_index(device, self._error)
        dks = [None] * len(keys)
        for i, (k, fw) in enumerate(zip(keys, fws)):
            if fw:
                dk = self.device_keys(xp, k)
                kd = xp.device_of(dk)
                if d is None:
                    d = kd
                elif kd != d:
                    if single:
                        raise self._error(f"HPS: keys are on cuda:{kd} but device is cuda:{d}; move them first")
                    raise self._error(f"HPS: keys of table {tabs[i].index} are on cuda:{kd} but "
                                      f"{'device' if device is not None else 'other keys'} are on cuda:{d}; "
                                      "move them first")
                dks[i] = dk
        if d is None:
            d = p.devices[0]
        if d not in p.caches:
            self._undeployed(p, d)
        if not any(fws):            # every table's host keys, to the device in one copy (by _serve)
            hk = [ps._keys(k) for k in keys]
            ns = [h.shape[0] for h in hk]
            if single and ns[0] == 0:       # nothing to look up (not counted as a lookup)
                return self._empty(p, d, "", device, return_defaulted)
            flat = np.concatenate(hk) if len(hk) > 1 else hk[0]
        else:                       # one device array of every table's keys
            if single and int(dks[0].shape[0]) == 0:
                return self._empty(p, d, fws[0], device, return_defaulted)
            with xp.device_context(d):
                for i, fw in enumerate(fws):
                    if not fw:
                        dks[i] = xp.put(ps._keys(keys[i]), d)
                ns = [int(k.shape[0]) for k in dks]
                flat = xp.cat(dks) if len(dks) > 1 else dks[0]
        uniform = fws.count(fws[0]) == len(fws)
        return self._serve(p, flat, ns, d, fws[0] if uniform else fws, device, return_defaulted, packed=False)

    def _empty(self, p: _Plan, d, fw, device, return_defaulted):
        """A one-table request without keys: empty rows (and flags) where they would go."""
        xp = self.ps._xp
        dim = p.dims[0]
        host = not fw and device is None
        with xp.device_context(d):
            out = xp.empty((0, dim), np.float32, d)
            res = xp.get(out) if host else xp.export_array(out, fw)
            z = np.zeros(0, bool)
            flags = z if host else xp.export_array(xp.put(z, d), fw)
        return [res], ([flags] if return_defaulted else None)

    # ---- one request --------------------------------------------------------------------------------
    def _serve(self, p: _Plan, flat_keys, ns: list, d: int, fw, device, return_defaulted: bool, packed: bool,
               flat_out: bool = False):
        """Serves a request whose keys are one device array (or, for host keys, still a host
        array) on device ``d``: the cache lookup of every table, then the misses. ``fw``: the
        keys' framework, one for all tables or one per table. Returns ``(rows, flags)``: lists
        per table, or (``flat_out``) one array each."""
        ps, xp = self.ps, self.ps._xp
        tabs = p.tabs
        tier, caches = p.caches[d]
        host_out = device is None and not (fw if isinstance(fw, str) else any(fw))
        lay = p.layout(ns, packed)
        with xp.device_context(d):
            if type(flat_keys) is np.ndarray:
                flat_keys = xp.put(flat_keys, d)
            flat = xp.empty_f32(lay.total, d)
            dst = ps._gpu_stats[d]
            with ps._lock:
                for t, n in zip(tabs, ns):
                    t.lookups += 1
                    t.keys += n
                epoch = ps._epoch
            t0 = time.perf_counter()
            missing, counts = tier.lookup_caches(caches, flat_keys, ns, flat, lay.offs)
            dt = time.perf_counter() - t0
            mtot = sum(counts)
            with ps._lock:
                st = dst["stats"]
                st.calls += len(tabs)
                st.seconds += dt
                st.hits += sum(ns) - mtot
                st.misses += mtot
            defaulted = pos_host = None
            if mtot:
                defaulted, pos_host = self.fill_misses(p, flat_keys, flat, lay, missing, ns, counts, d, epoch, tier)
            # The rows.
            if flat_out:
                rows = xp.get(flat) if host_out else xp.export_array(flat, fw)
            elif host_out:
                rows = xp.host_views(xp.get(flat), lay.segs)       # every table's rows in one copy
            elif isinstance(fw, str):
                rows = xp.views(flat, lay.segs, fw)
            else:       # tables' keys in different frameworks: each table's rows in its keys' one
                rows = [xp.export_array(r, f) for r, f in zip(xp.views(flat, lay.segs, xp.name), fw)]
            if not return_defaulted:
                return rows, None
            # Which keys got the default value: one host array, one copy to the device.
            f = np.zeros(sum(ns), bool)
            if defaulted is not None:
                for i, dflt in enumerate(defaulted):
                    if dflt is not None:
                        f[lay.key_offs[i] + pos_host[i]] = dflt
            if flat_out:
                return rows, (f if host_out else xp.export_array(xp.put(f, d), fw))
            if host_out:
                return rows, xp.host_views(f, [(0, f.shape[0], 0, ns)])
            fd = xp.put(f, d)
            if isinstance(fw, str):
                return rows, xp.views(fd, [(0, f.shape[0], 0, ns)], fw)
            return rows, [xp.export_array(x, g) for x, g in zip(xp.views(fd, [(0, f.shape[0], 0, ns)], xp.name), fw)]

    def fill_misses(self, p: _Plan, flat_keys, flat, lay: _Layout, missing, ns, counts, d, epoch,
                    cache: GpuCacheTier):
        """The misses of every table of a request: their positions and keys to the host in one
        copy, the tiers below table by table, their rows back in one copy, scattered into the
        output, and (dynamic caches) inserted into the device's caches. Returns
        ``(defaulted, pos_host)``: per table, which misses got the default (None: none did) and
        the miss positions (host), None for tables without misses."""
        ps, xp = self.ps, self.ps._xp
        tabs = p.tabs
        defaulted = [None] * len(tabs)
        pos_host = [None] * len(tabs)
        sel, koffs = [], []
        for i, (o, m) in enumerate(zip(lay.key_offs, counts)):
            if m:
                sel.append(i)
                koffs.append(o)
        pos = [missing[o_:o_ + counts[i]] for i, o_ in zip(sel, koffs)]
        mkeys = [xp.take(flat_keys[o_:o_ + ns[i]], q) for i, o_, q in zip(sel, koffs, pos)]
        both = xp.get(xp.cat(pos + mkeys))           # positions and keys of every miss: one copy
        mtot = sum(counts[i] for i in sel)
        hpos, hkeys = both[:mtot], both[mtot:]
        rows_h, o = [], 0
        below = ps._paths_below[p.model]
        for i in sel:
            m, tab = counts[i], tabs[i]
            pos_host[i] = hpos[o:o + m]
            ukeys, inverse = np.unique(hkeys[o:o + m], return_inverse=True)
            o += m
            rows_u, missing_u, _ = ps._walk(tab, ukeys, below, epoch)
            rows_h.append(rows_u[inverse].reshape(-1))
            if missing_u.size:
                udef = np.zeros(ukeys.shape[0], bool)
                udef[missing_u] = True
                defaulted[i] = udef[inverse]
                with ps._lock:
                    tab.defaults_returned += int(np.count_nonzero(defaulted[i]))
        rows_d = xp.split_views(xp.put(np.concatenate(rows_h) if len(rows_h) > 1 else rows_h[0], d),
                                [(counts[i], tabs[i].dim) for i in sel])   # every miss's row: one copy
        sync_items, async_items = [], []
        for j, i in enumerate(sel):
            tab, q, rows = tabs[i], pos[j], rows_d[j]
            xp.scatter(xp.row_view(flat, lay.offs[i], ns[i], tab.dim), q, rows)
            dflt = defaulted[i]
            if not tab.dynamic or (dflt is not None and dflt.all()):
                continue
            if dflt is None:
                ik, irows = mkeys[j], rows
            else:       # the defaults do not go into the cache
                keep = xp.put(np.flatnonzero(~dflt), d)
                ik, irows = xp.take(mkeys[j], keep), xp.take(rows, keep)
            item = (tab, ik, irows)
            (sync_items if (1.0 - counts[i] / ns[i]) < tab.threshold else async_items).append(item)
        if sync_items or async_items:
            ready = xp.record(xp.current_stream(d))
            if sync_items:
                self.insert_many(cache, sync_items, ready, epoch, sync=True)
            if async_items:
                self.insert_many(cache, async_items, ready, epoch, sync=False)
        return defaulted, pos_host

    # ---- cache inserts ------------------------------------------------------------------------------
    def insert_many(self, cache: GpuCacheTier, items: list, ready, epoch: int, sync: bool) -> None:
        """Rows found below a dynamic GPU cache, ``[(tab, keys, rows), ...]``, into it (on its
        write stream, under one hold of the write order): waited for before the lookup returns
        when the batch's hit rate is below ``hit_rate_threshold``, else enqueued by the
        background thread (the lookup returns first). Skipped when an update or refresh ran
        since the lookup began (its rows may be older)."""
        ps = self.ps
        dst = ps._gpu_stats[cache.device]

        def check():
            with ps._lock:
                return not ps._closed and ps._current(epoch)

        def go(counter: str):
            ev = cache.insert_many_async([(t.name, k, v) for t, k, v in items], ready, check)
            with ps._lock:
                for t, k, _ in items:
                    n = int(k.shape[0])
                    if ev is None:
                        dst["inserts_skipped"] += n
                        continue
                    dst[counter] += n
                    dst["stats"].inserted += n
                    ps._stats["cache"].inserted += n
                    if counter == "sync_inserts":
                        t.sync_inserts += n
                    else:
                        t.async_inserts += n
            if ev is not None:
                ev.synchronize()    # keeps keys and rows alive until the inserts have run

        if sync:
            go("sync_inserts")
        else:
            ps._enqueue_call(lambda: go("async_inserts"))
