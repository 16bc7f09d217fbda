"""embedlab.data.criteo: generator layout/determinism/signal, parser, malformed lines, ETL, split."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

import reference_data as ref
from embedlab.data import criteo


def _lines(path):
    return open(path, encoding="latin-1", newline="").read().splitlines(keepends=True)


def test_generate_exact_kaggle_layout(tmp_path, run_seed):
    p = criteo.generate(tmp_path / "g.txt", rows=5000, seed=run_seed, progress=False)
    lines = _lines(p)
    assert len(lines) == 5000
    parsed = [ref.parse_line(l) for l in lines]          # raises on any malformed line
    for l in lines[:200]:
        fields = l.rstrip("\n").split("\t")
        assert len(fields) == 40
        for x in fields[14:]:
            assert x == "" or (len(x) == 8 and x == x.lower())
        for x in fields[1:14]:
            assert x == "" or x.lstrip("-").isdigit()
            assert not (len(x) > 1 and x.lstrip("-").startswith("0"))   # no zero padding
    labels = np.array([r[0] for r in parsed])
    assert 0.1 < labels.mean() < 0.4, labels.mean()
    ints = [[r[1][j] for r in parsed] for j in range(13)]
    assert sum(v is None for v in ints[0]) > 1000           # I1 is often missing, as in Kaggle
    assert min(v for v in ints[1] if v is not None) < 0     # I2 carries negatives
    cats = np.array([r[2] for r in parsed])
    assert (cats[:, 21] == ref.MISSING).mean() > 0.5       # C22 mostly missing
    assert (cats[:, 0] != ref.MISSING).all()


def test_generate_is_deterministic_and_prefix_stable(tmp_path, run_seed):
    a = criteo.generate(tmp_path / "a.txt", rows=70_000, seed=run_seed, progress=False)
    b = criteo.generate(tmp_path / "b.txt", rows=70_000, seed=run_seed, progress=False)
    c = criteo.generate(tmp_path / "c.txt", rows=1_234, seed=run_seed, progress=False)
    d = criteo.generate(tmp_path / "d.txt", rows=1_234, seed=run_seed + 1, progress=False)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes().startswith(c.read_bytes())
    assert c.read_bytes() != d.read_bytes()
    assert not list(tmp_path.glob(".*tmp*"))               # no temporary files left behind


def test_generate_gzip_and_bad_args(tmp_path):
    p = criteo.generate(tmp_path / "g.txt.gz", rows=300, seed=2, progress=False)
    plain = criteo.generate(tmp_path / "g.txt", rows=300, seed=2, progress=False)
    assert gzip.decompress(p.read_bytes()) == plain.read_bytes()
    with pytest.raises(ValueError, match="rows"):
        criteo.generate(tmp_path / "x.txt", rows=-1)
    with pytest.raises(ValueError, match="seed"):
        criteo.generate(tmp_path / "x.txt", rows=5, seed=-3)
    assert criteo.generate(tmp_path / "empty.txt", rows=0, progress=False).read_bytes() == b""


def test_generate_power_law_frequencies(tmp_path, run_seed):
    p = criteo.generate(tmp_path / "g.txt", rows=30_000, seed=run_seed, progress=False)
    cats = np.concatenate([b.cats for _, b in criteo.read_chunks(p)])
    for j in (2, 11, 20):                                  # ~10M, 8M, 7M-value universes
        col = cats[:, j][cats[:, j] != criteo.MISSING_HEX]
        _, counts = np.unique(col, return_counts=True)
        counts = np.sort(counts)[::-1]
        assert counts[0] > 20 * np.median(counts)          # a heavy head ...
        assert (counts == 1).sum() > 0.3 * len(counts)     # ... and a long tail of singletons
    # Small universes are covered but still skewed.
    _, c9 = np.unique(cats[:, 8], return_counts=True)
    assert len(c9) == 3 and c9.max() > 2 * c9.min()


def test_generated_data_is_learnable(criteo_small):
    """A logistic regression on one-hot categoricals + dense features beats chance clearly."""
    from scipy import sparse
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score
    from embedlab.data import formats
    _, res = criteo_small
    tr, te = formats.read_parquet(res.dst / "train"), formats.read_parquet(res.dst / "val")
    width = sum(res.slot_size_array)

    def design(d):
        ids = np.stack([d[c] for c in res.columns], axis=1)
        rows = np.repeat(np.arange(len(ids)), ids.shape[1])
        onehot = sparse.csr_matrix((np.ones(ids.size), (rows, ids.ravel())),
                                   shape=(len(ids), width))
        return sparse.hstack([onehot, np.stack([d[c] for c in criteo.INT_COLUMNS], 1)]).tocsr()

    model = LogisticRegression(C=0.3, max_iter=300).fit(design(tr), tr["label"])
    auc = roc_auc_score(te["label"], model.predict_proba(design(te))[:, 1])
    print("held-out AUC", auc)
    assert auc > 0.6


def _messy_file(tmp_path, rng):
    """Generated lines with malformed ones at random places; returns (path, good lines, bad)."""
    base = criteo.generate(tmp_path / "base.txt", rows=400, seed=int(rng.integers(1 << 30)),
                           progress=False)
    lines = _lines(base)
    good = list(lines)
    breakers = [
        lambda f: f[:-1],                                   # 39 fields
        lambda f: f + ["x"],                               # 41 fields
        lambda f: [f[0]] + ["12a"] + f[2:],                 # non-numeric integer
        lambda f: [f[0]] + ["-"] + f[2:],                   # lone minus
        lambda f: f[:20] + ["zz345678"] + f[21:],           # bad hex
        lambda f: f[:20] + ["abc1234"] + f[21:],            # 7 hex digits
        lambda f: ["2"] + f[1:],                            # bad label
        lambda f: [""],                                     # empty line
    ]
    where = sorted(rng.choice(len(lines), size=len(breakers), replace=False))
    bad = {}
    for k, (i, brk) in enumerate(zip(where, rng.permutation(len(breakers)))):
        f = lines[i].rstrip("\n").split("\t")
        lines[i] = "\t".join(breakers[brk](f)) + "\n"
        bad[i + 1] = lines[i]
    p = tmp_path / "messy.txt"
    p.write_text("".join(lines), encoding="latin-1")
    return p, [l for i, l in enumerate(good) if i + 1 not in bad], bad


def test_parser_matches_python_oracle(tmp_path, rng):
    p, _, bad = _messy_file(tmp_path, rng)
    # Extra hand-made lines: CRLF, uppercase hex, negative numbers, a final line with no newline.
    extra = ("1\t-5\t\t3" + "\t" * 10 + "\tABCDEF01" + "\t" * 25 + "\r\n"
             + "0\t" + "\t".join(["7"] * 13) + "\t" + "\t".join(["0000000f"] * 26))
    p.write_text(p.read_text(encoding="latin-1") + extra, encoding="latin-1")
    lines = _lines(p)
    errors = []
    blocks = list(criteo.read_chunks(p, chunk_bytes=3000, on_error="skip", errors=errors))
    got = {int(l): (int(b.label[i]), b.ints[i], b.int_missing[i], b.cats[i])
           for _, b in blocks for i, l in enumerate(b.line)}
    assert sorted(int(l) for _, l, _ in errors) == sorted(bad)
    for no, line in enumerate(lines, start=1):
        if no in bad:
            assert no not in got
            continue
        lab, ints, cats = ref.parse_line(line)
        g = got[no]
        assert g[0] == lab
        assert [None if m else int(v) for v, m in zip(g[1], g[2])] == ints, no
        assert g[3].tolist() == cats


def test_malformed_lines_fail_or_skip(tmp_path, rng):
    p, good, bad = _messy_file(tmp_path, rng)
    first = min(bad)
    with pytest.raises(criteo.CriteoFormatError) as e:
        list(criteo.read_chunks(p))
    assert e.value.line == first and str(p) in str(e.value) and f":{first}:" in str(e.value)
    # preprocess: fail leaves nothing; skip counts, reports and drops exactly the bad lines.
    dst = tmp_path / "out"
    with pytest.raises(criteo.CriteoFormatError, match=f"messy.txt:{first}:"):
        criteo.preprocess(p, dst, progress=False, split=None)
    assert not dst.exists() and not list(tmp_path.glob(".out*"))
    with pytest.warns(UserWarning, match=f"skipped {len(bad)} malformed"):
        res = criteo.preprocess(p, dst, progress=False, split=None, on_error="skip")
    assert res.malformed == len(bad)
    assert [l for _, l, _ in res.errors] == sorted(bad)
    assert all(str(p) == f for f, _, _ in res.errors)
    reasons = " ".join(r for _, _, r in res.errors)
    for word in ("fields", "not a number", "hex", "label"):
        assert word in reasons
    assert res.rows["train"] == len(good)
    with pytest.raises(ValueError, match="on_error"):
        criteo.preprocess(p, dst, on_error="ignore")


def test_preprocess_matches_oracle(tmp_path, rng):
    n = int(rng.integers(800, 1500))
    src = criteo.generate(tmp_path / "d.txt", rows=n, seed=int(rng.integers(1 << 30)),
                          progress=False)
    lines = _lines(src)
    thr = int(rng.integers(1, 4))
    for normalize, cross in ((True, True), (False, False)):
        res = criteo.preprocess(src, tmp_path / f"pq{normalize}", freq_threshold=thr,
                                normalize_dense=normalize, feature_cross=cross,
                                row_group_rows=int(rng.integers(50, 400)), rows_per_file=700,
                                chunk_bytes=int(rng.integers(2000, 50_000)), progress=False)
        counts = criteo.split_counts(n)
        want, sizes, offsets = ref.preprocess(lines, counts, thr, normalize, cross)
        assert res.slot_size_array == sizes and res.offsets == offsets
        saved = json.loads((res.dst / "slot_size_array.json").read_text())
        assert saved["slot_size_array"] == sizes and saved["columns"] == res.columns
        for name, rows in want.items():
            tables = [pq.read_table(f) for f in res.files[name]]
            assert all(t.num_rows <= 700 for t in tables)
            got = {c: np.concatenate([t.column(c).to_numpy() for t in tables])
                   for c in tables[0].column_names}
            assert len(got["label"]) == len(rows) == res.rows[name]
            for c in got:
                exp = np.array([r[c] for r in rows])
                if c.startswith("I") or c == "label":
                    assert got[c].dtype == np.float32
                    np.testing.assert_allclose(got[c], exp, rtol=1e-6, atol=1e-6, err_msg=c)
                else:
                    assert got[c].dtype == np.int64
                    np.testing.assert_array_equal(got[c], exp, err_msg=c)


def test_preprocess_multi_file_gzip_and_atomic_replace(tmp_path, run_seed):
    a = criteo.generate(tmp_path / "a.txt.gz", rows=900, seed=run_seed, progress=False)
    b = criteo.generate(tmp_path / "b.txt", rows=700, seed=run_seed + 7, progress=False)
    both = tmp_path / "both.txt"
    both.write_bytes(gzip.decompress(a.read_bytes()) + b.read_bytes())
    r1 = criteo.preprocess([a, b], tmp_path / "m", progress=False, freq_threshold=2)
    r2 = criteo.preprocess(both, tmp_path / "s", progress=False, freq_threshold=2)
    assert r1.rows == r2.rows and r1.slot_size_array == r2.slot_size_array
    for name in r1.files:
        t1 = pq.read_table(r1.files[name][0])
        t2 = pq.read_table(r2.files[name][0])
        assert t1.equals(t2)
    # Re-running into an existing folder replaces it; a failing run leaves it untouched.
    before = (tmp_path / "m" / "metadata.json").read_text()
    broken = tmp_path / "broken.txt"
    broken.write_text("1\t2\n")
    with pytest.raises(criteo.CriteoFormatError):
        criteo.preprocess(broken, tmp_path / "m", progress=False)
    assert (tmp_path / "m" / "metadata.json").read_text() == before


def test_split_counts_and_split(tmp_path, run_seed):
    assert criteo.split_counts(45_840_617) == criteo.KAGGLE_SPLIT
    assert sum(criteo.split_counts(12_345)) == 12_345
    src = criteo.generate(tmp_path / "t.txt", rows=2_500, seed=run_seed, progress=False)
    out = criteo.split(src, tmp_path / "sp", chunk_bytes=10_000)
    sizes = [len(_lines(out[n])) for n in criteo.SPLIT_NAMES]
    assert tuple(sizes) == criteo.split_counts(2_500)
    assert b"".join(out[n].read_bytes() for n in criteo.SPLIT_NAMES) == src.read_bytes()
    out = criteo.split(src, tmp_path / "sp2", counts=[10, 0, 2490])
    assert out["val"].read_bytes() == b"" and len(_lines(out["train"])) == 10
    with pytest.raises(ValueError, match="sum to"):
        criteo.split(src, tmp_path / "sp3", counts=[1, 2, 3])
    with pytest.raises(FileNotFoundError):
        criteo.split(tmp_path / "nope.txt", tmp_path / "sp4")


@pytest.mark.parametrize("field", ["+5", " 5", "5 ", "0x5", "5.0", "1e3", "５"])
def test_integers_are_parsed_strictly(tmp_path, field, run_seed):
    """pyarrow alone would accept some of these; the Kaggle format does not."""
    src = criteo.generate(tmp_path / "g.txt", rows=50, seed=run_seed, progress=False)
    lines = _lines(src)
    f = lines[20].rstrip("\n").split("\t")
    f[3] = field
    lines[20] = "\t".join(f) + "\n"
    p = tmp_path / "odd.txt"
    p.write_bytes("".join(lines).encode("utf-8"))
    errors = []
    rows = sum(len(b) for _, b in criteo.read_chunks(p, on_error="skip", errors=errors))
    assert rows == 49 and [l for _, l, _ in errors] == [21]
    assert "I3" in errors[0][2]
