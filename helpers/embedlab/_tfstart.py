"""TensorFlow without its start-up chatter, for notebooks and scripts.

TensorFlow's C++ runtime prints a banner when it loads, before its logging can be configured
(`TF_CPP_MIN_LOG_LEVEL` does not silence it): "All log messages before absl::InitializeLog()
...", "oneDNN custom operations are on ...", and which CPU instructions the binary could use,
once per library that loads, so two or three times. `import_tensorflow()` imports TensorFlow
with the process's stderr (file descriptor 2, which Jupyter kernels forward into cell outputs)
read into a buffer, drops exactly those lines and passes every other line through. It also
sets `TF_CPP_MIN_LOG_LEVEL=2` unless it is set (C++ INFO and WARNING logs off), and
TensorFlow's Python logger to WARNING (no "INFO:tensorflow:Assets written to ..." per saved
model).
"""
from __future__ import annotations

import os
import sys
import tempfile

_BANNER = (
    "All log messages before absl::InitializeLog() is called",
    "oneDNN custom operations are on",
    "cpu_feature_guard.cc",
    "To enable the following instructions:",
    "This TensorFlow binary is optimized to use available CPU instructions",
)


def _filter(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not any(b in line for b in _BANNER))


def import_tensorflow():
    """Imports and returns `tensorflow`, without its C++ start-up banner (see the module doc).

    Example:
        >>> import embedlab
        >>> tf = embedlab.import_tensorflow()
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "tensorflow" not in sys.modules:
        try:
            sys.stderr.flush()
        except (AttributeError, ValueError):
            pass
        saved = os.dup(2)
        with tempfile.TemporaryFile() as buf:
            os.dup2(buf.fileno(), 2)
            try:
                import tensorflow  # noqa: F401
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                buf.seek(0)
                rest = _filter(buf.read().decode("utf-8", errors="replace"))
                if rest:
                    sys.stderr.write(rest)
    import tensorflow as tf
    tf.get_logger().setLevel("WARNING")
    return tf
