"""`embedlab.tutorials.training` (notebook 01's timing helpers), by this name too."""
import sys

from ..tutorials import training as _training

sys.modules[__name__] = _training
