"""`embedlab.tutorials.sok_demo` (notebook 04's DeepFM), by this name too; `python -m
embedlab.sok.demo` runs it."""
import sys

from ..tutorials import sok_demo as _sok_demo

if __name__ == "__main__":
    _sok_demo.main()
else:
    sys.modules[__name__] = _sok_demo
