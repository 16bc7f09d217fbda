"""The lab's working copies of the notebooks, and the guard that keeps the lesson sources unchanged.

`make lab` (ci/lab.sh) runs this before JupyterLab starts:

    python ci/lab_notebooks.py --dest build/lab

notebooks/NN_*.ipynb are the lesson sources, tracked by git and committed without outputs. The
lab works on copies of them in DEST/notebooks/ (git-ignored, under build/): a learner runs and
saves there, and finds the outputs and edits again in the next session. The lab's file browser
opens on that folder. At each start:

- a notebook without a copy gets one;
- a copy whose source is unchanged since it was made is kept as the learner left it;
- when a source changed (a `git pull`), its copy is replaced by the new lesson, and a copy the
  learner had saved since is first moved to DEST/kept/NAME.<UTC time>.ipynb (and the move is
  printed): nothing a learner saved is overwritten;
- copies of notebooks that are no longer in notebooks/ are left alone.
DEST/sources.json records, for each copy, the source it was made from and the text it was written
with. The copies get the `kernelspec` and `language_info` of the lab's own kernel (this
interpreter's ipykernel), so that opening one does not mark it modified.

This module is also a Jupyter server extension (ci/jupyter_server_config.py enables it): it
registers `refuse_lesson_sources` as a pre-save hook of the contents manager, so that any save under
notebooks/ (a source, or a new file there) is refused with HTTP 403 and a message that names the
working copies (EMBEDLAB_LAB_NOTEBOOKS, which ci/lab.sh sets).
"""
import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
from normalize_notebooks import kernel_metadata, notebook_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIR = "notebooks"            # the lesson sources, relative to the checkout (the lab's root)
DEFAULT_DEST = "build/lab"
MANIFEST = "sources.json"


def _sha256(text):
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def working_copy_text(source_text, metadata):
    """The text of a working copy of a source notebook: the source with the lab kernel's metadata."""
    nb = nbformat.reads(source_text, as_version=4)
    nb.metadata["kernelspec"] = nbformat.from_dict(metadata["kernelspec"])
    nb.metadata["language_info"] = nbformat.from_dict(metadata["language_info"])
    return notebook_text(nb)


def _write(path, text):
    tmp = path.with_name(f".{path.name}.lab.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def sync(sources, dest, metadata=None, now=None):
    """Brings the working copies in `dest`/notebooks up to date with the source notebooks.

    Args:
        sources: the source notebook files (notebooks/NN_*.ipynb).
        dest: the lab's folder (e.g. build/lab): copies go to dest/notebooks, replaced learner
            copies to dest/kept, the record of what was copied to dest/sources.json.
        metadata: the kernel metadata for the copies (default: `kernel_metadata()`).
        now: the UTC time stamp for kept copies (default: the current time, YYYYmmddTHHMMSSZ).

    Returns:
        list of (name, what, kept) for every notebook: `what` is one of "new copy", "up to date",
        "your saved copy", "kernel metadata refreshed", "updated to the changed lesson"; `kept`
        is where the learner's replaced copy went (a Path), else None.

    Raises:
        ValueError: a source is not a readable notebook, or dest/sources.json is corrupt (the message names it).

    Example:
        >>> sync(sorted(Path("notebooks").glob("[0-9][0-9]_*.ipynb")), Path("build/lab"))  # doctest: +SKIP
        [('01_embedding_plugin.ipynb', 'up to date', None), ...]
    """
    dest = Path(dest)
    copies, kept = dest / "notebooks", dest / "kept"
    copies.mkdir(parents=True, exist_ok=True)
    manifest_path = dest / MANIFEST
    try:
        record = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    except (OSError, ValueError) as e:
        raise ValueError(f"{manifest_path}: not the lab's record of its copies ({e}); move it away to start over "
                         "(the copies in it are kept)") from None
    if not isinstance(record, dict):
        raise ValueError(f"{manifest_path}: not the lab's record of its copies (a {type(record).__name__}); "
                         "move it away to start over")
    metadata = kernel_metadata() if metadata is None else metadata
    stamp = now or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    report = []
    for src in sources:
        src = Path(src)
        source_text = src.read_text(encoding="utf-8")
        try:
            text = working_copy_text(source_text, metadata)
        except Exception as e:  # nbformat raises several kinds for a broken file
            raise ValueError(f"{src}: not a readable notebook: {e}") from None
        copy = copies / src.name
        entry = record.get(src.name, {})
        current = copy.read_text(encoding="utf-8") if copy.exists() else None
        target = None
        if current is None:
            what = "new copy"
        elif current == text:
            what = "up to date"
        elif entry.get("source_sha256") == _sha256(source_text):
            if _sha256(current) != entry.get("copy_sha256"):
                report.append((src.name, "your saved copy", None))  # the learner's work on the current lesson
                continue
            what = "kernel metadata refreshed"  # a copy never saved, made for another interpreter
        elif entry and _sha256(current) == entry.get("copy_sha256"):
            what = "updated to the changed lesson"  # the learner never saved this copy: nothing to keep
        else:
            kept.mkdir(parents=True, exist_ok=True)
            target = kept / f"{src.stem}.{stamp}.ipynb"
            n = 1
            while target.exists():
                target = kept / f"{src.stem}.{stamp}-{n}.ipynb"
                n += 1
            copy.replace(target)
            what = "updated to the changed lesson"
        if current != text:
            _write(copy, text)
        record[src.name] = {"source_sha256": _sha256(source_text), "copy_sha256": _sha256(text)}
        report.append((src.name, what, target))
    _write(manifest_path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return report


def refuse_lesson_sources(model, path, contents_manager, working_dir=f"{DEFAULT_DEST}/notebooks", **kwargs):
    """Contents-manager pre-save hook: refuses every save under notebooks/ with HTTP 403.

    Bind `working_dir` with functools.partial to name the lab's working copies in the message.

    Args:
        model: the contents model being saved (unused: any save there is refused).
        path: the API path (relative to the lab's root folder, the checkout).
        contents_manager: the server's contents manager.
        working_dir: the working copies' folder, as an API path.

    Raises:
        tornado.web.HTTPError: 403, for a path in notebooks/; Jupyter shows its message and
            writes nothing.

    Example:
        >>> refuse_lesson_sources(model={}, path="build/lab/notebooks/01_x.ipynb", contents_manager=None)
    """
    from tornado.web import HTTPError

    parts = [p for p in str(path).strip("/").split("/") if p]
    if len(parts) > 1 and parts[0] == SOURCE_DIR:
        raise HTTPError(403, f"not saved: {SOURCE_DIR}/ holds the lesson sources, which the lab never changes "
                             f"({path}). Work in your copies in {working_dir}/; File > Save Notebook As... "
                             f"into that folder keeps what this notebook shows.")


def _jupyter_server_extension_points():
    return [{"module": "lab_notebooks"}]


def _load_jupyter_server_extension(serverapp):
    """Registers the save guard on the server's contents manager (once, at server start)."""
    working_dir = os.environ.get("EMBEDLAB_LAB_NOTEBOOKS", f"{DEFAULT_DEST}/notebooks")

    def embedlab_refuse_lesson_sources(model, path, contents_manager, **kwargs):
        refuse_lesson_sources(model, path, contents_manager, working_dir=working_dir, **kwargs)

    serverapp.contents_manager.register_pre_save_hook(embedlab_refuse_lesson_sources)
    serverapp.log.info(f"EmbedLab: saves into {SOURCE_DIR}/ are refused; the working copies are in {working_dir}/")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dest", type=Path, default=Path(DEFAULT_DEST),
                    help=f"the lab's folder for its copies (default {DEFAULT_DEST}; inside the checkout)")
    args = ap.parse_args(argv)
    sources = sorted((ROOT / SOURCE_DIR).glob("[0-9][0-9]_*.ipynb"))
    if not sources:
        print(f"lab_notebooks: no notebooks in {ROOT / SOURCE_DIR}", file=sys.stderr)
        return 1
    try:
        report = sync(sources, args.dest)
    except ValueError as e:
        print(f"lab_notebooks: {e}", file=sys.stderr)
        return 1
    counts = {}
    for name, what, kept in report:
        counts[what] = counts.get(what, 0) + 1
        if kept is not None:
            print(f"   {SOURCE_DIR}/{name} changed since your copy was made: the copy is updated, and the one you "
                  f"saved is kept as {kept}")
    print(f"   working copies in {args.dest}/notebooks: " + ", ".join(f"{n} {w}" for w, n in counts.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
