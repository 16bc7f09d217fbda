# Jupyter server configuration of `make lab` (ci/lab.sh passes it with --config; a user's own
# ~/.jupyter configuration still applies).
#
# The lesson sources, notebooks/*.ipynb, are tracked by git and committed without outputs; the lab
# works on copies of them (ci/lab_notebooks.py makes them before the server starts). The server
# extension enabled here (ci/lab_notebooks.py) registers a pre-save hook that refuses every save
# into notebooks/ with HTTP 403 and a message naming the working copies, so that running or saving
# a notebook in the lab never changes a tracked file, whichever notebook the learner opened.
# (An extension rather than ContentsManager.pre_save_hook: Jupyter reads this file twice, and
# setting that option twice prints a warning at every start.)
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the server's import path only, not the kernels'

c = get_config()  # noqa: F821 (defined by Jupyter when it reads this file)
c.ServerApp.jpserver_extensions.update({"lab_notebooks": True})
