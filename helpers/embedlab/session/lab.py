"""`embedlab.tutorials.session_lab` (notebook 03's helpers), by this name too."""
import sys

from ..tutorials import session_lab as _session_lab

sys.modules[__name__] = _session_lab
