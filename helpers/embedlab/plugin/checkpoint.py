"""The file `EmbeddingLayer.save` writes and `restore` reads: one table in key order, checked.

Format: b"EMBLABPL", u32 version, u32 header length, a JSON header (vocabulary_size,
embedding_vec_size, dtype, payload bytes and CRC32, the layer's name), the header's own CRC32,
then the float32 little-endian rows ``[vocabulary_size, embedding_vec_size]`` in key order.
Device count and embedding_type are not part of the file, so it restores into a layer sharded
differently. The file is written atomically (to a temporary name, fsync'ed, renamed into place).
"""
from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np

from .._io import atomic_file

__all__ = ["CheckpointError", "write_table", "read_table"]

_MAGIC = b"EMBLABPL"
_VERSION = 1
# magic(8) | version u32 | header_len u32 | header JSON | header CRC32 u32 | payload
_PREFIX = struct.Struct("<8sII")


class CheckpointError(ValueError):
    """A plugin checkpoint is truncated, corrupt, or does not fit the layer."""


def write_table(path, table, layer: str) -> Path:
    """Write `table` (``[vocabulary_size, vec]``, key order) to `path` for the layer named `layer`.

    Returns:
        `Path(path)`.
    """
    path = Path(path)
    table = np.ascontiguousarray(table, dtype="<f4")
    payload = table.tobytes()
    header = {"format": "embedlab.plugin.EmbeddingLayer", "vocabulary_size": int(table.shape[0]),
              "embedding_vec_size": int(table.shape[1]), "dtype": "float32", "order": "key",
              "payload_bytes": len(payload), "payload_crc32": zlib.crc32(payload),
              "layer": layer}
    hb = json.dumps(header, sort_keys=True).encode()
    with atomic_file(path, fsync=True) as tmp:
        with open(tmp, "wb") as f:
            for chunk in (_PREFIX.pack(_MAGIC, _VERSION, len(hb)), hb, struct.pack("<I", zlib.crc32(hb)), payload):
                f.write(chunk)
    return path


def read_table(path, vocabulary_size: int, embedding_vec_size: int, who: str) -> np.ndarray:
    """The ``[vocabulary_size, embedding_vec_size]`` float32 table in the file `path`, checked.

    Everything is checked: magic, version, header CRC, sizes, payload length and CRC32.

    Args:
        path: a file written by :func:`write_table`.
        vocabulary_size, embedding_vec_size: the shape the caller needs.
        who: names the reader in errors (e.g. "EmbeddingLayer 'emb'").

    Raises:
        CheckpointError: naming `who`, the file and the problem.
    """
    path = Path(path)

    def fail(why):
        raise CheckpointError(f"{who}: cannot restore {path}: {why}")

    try:
        data = path.read_bytes()
    except OSError as e:
        fail(f"{e.strerror or e}")
    if len(data) < _PREFIX.size:
        fail(f"file is {len(data)} bytes, too short for the header (truncated?)")
    magic, version, hlen = _PREFIX.unpack_from(data, 0)
    if magic != _MAGIC:
        fail(f"not an EmbedLab plugin checkpoint (magic {magic!r})")
    if version != _VERSION:
        fail(f"format version {version}, this EmbedLab reads version {_VERSION}")
    h0 = _PREFIX.size
    if len(data) < h0 + hlen + 4:
        fail("truncated header")
    hb = data[h0:h0 + hlen]
    (hcrc,) = struct.unpack_from("<I", data, h0 + hlen)
    if zlib.crc32(hb) != hcrc:
        fail("header checksum mismatch (corrupt file)")
    try:
        header = json.loads(hb)
    except ValueError:
        fail("header is not valid JSON")
    payload = memoryview(data)[h0 + hlen + 4:]
    if len(payload) != header.get("payload_bytes"):
        fail(f"payload is {len(payload)} bytes, header says {header.get('payload_bytes')} (truncated?)")
    if zlib.crc32(payload) != header.get("payload_crc32"):
        fail("payload checksum mismatch (corrupt file)")
    V, D = header.get("vocabulary_size"), header.get("embedding_vec_size")
    if (V, D) != (vocabulary_size, embedding_vec_size):
        fail(f"file holds a [{V}, {D}] table, this layer is [{vocabulary_size}, {embedding_vec_size}]")
    return np.frombuffer(payload, dtype="<f4").reshape(V, D)
