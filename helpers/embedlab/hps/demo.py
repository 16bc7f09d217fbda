"""`embedlab.tutorials.hps_demo` (notebook 05's tier demos), by this name too."""
import sys

from ..tutorials import hps_demo as _hps_demo

sys.modules[__name__] = _hps_demo
