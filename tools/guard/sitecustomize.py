"""Loaded at the start of every Python process of a chapter's run (tools/steps.py puts this
folder first on PYTHONPATH; processes that the run starts inherit it).

* Isolation: ``minisgl`` comes from the chapter's tree ($MINISGL_BOOK_TREE) and from nowhere
  else: not from an editable install of the repository, not from site-packages. At exit, a
  process that loaded a ``minisgl`` module from elsewhere fails with exit code 86.
* A record of what ran: when $MINISGL_BOOK_LOADED names a folder, the process writes the
  files of the package modules it loaded to <folder>/<pid>.txt at exit.
* What each test ran: when $MINISGL_BOOK_RECORD names a folder, the package's functions
  report their first call (book_record.py), for tools/steps.py to choose what to rerun.
* Stacks on request: when $MINISGL_BOOK_STACKS names a folder, SIGUSR1 makes this process
  write the stack of each of its threads to <folder>/<pid>.txt, even while it is blocked
  inside C code (tools/supervise.py asks for them before it kills a run that hangs).
"""

import atexit
import faulthandler
import importlib.machinery
import os
import signal
import sys

_TREE = os.path.realpath(os.environ["MINISGL_BOOK_TREE"])
_PKG = os.environ.get("MINISGL_BOOK_PACKAGE", "minisgl")
_CHAPTER = os.environ.get("MINISGL_BOOK_CHAPTER", "?")  # 7, or P1 for a project
_NAME = f"{'project' if _CHAPTER.startswith('P') else 'chapter'} {_CHAPTER}"

# an editable install of the repository must not serve the package
sys.meta_path[:] = [f for f in sys.meta_path if _PKG not in type(f).__module__]
sys.path[:] = [
    p
    for p in sys.path
    if os.path.realpath(p or ".") == _TREE
    or not os.path.exists(os.path.join(p or ".", _PKG, "__init__.py"))
]


class _TreeOnly:
    """Find the top-level package in the chapter's tree and nowhere else."""

    def find_spec(self, name, path=None, target=None):
        if name != _PKG:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, [_TREE])
        if spec is None:
            raise ModuleNotFoundError(
                f"No module named '{name}' ({_NAME}'s tree has no {name}/)", name=name
            )
        return spec


sys.meta_path.insert(0, _TreeOnly())


def _package_files():
    """file (relative to the tree) of every package module this process loaded"""
    files = []
    for mod_name, mod in list(sys.modules.items()):
        file = getattr(mod, "__file__", None)
        if (mod_name == _PKG or mod_name.startswith(_PKG + ".")) and file:
            real = os.path.realpath(file)
            if not real.startswith(_TREE + os.sep):
                sys.stderr.write(f"steps.py: {mod_name} was loaded from {file}, outside the tree\n")
                sys.stderr.flush()
                os._exit(86)
            files.append(os.path.relpath(real, _TREE).replace(os.sep, "/"))
    return files


def _at_exit():
    files = _package_files()
    folder = os.environ.get("MINISGL_BOOK_LOADED")
    if folder:  # tools/steps.py compares what ran with what tools/deps.py predicted
        with open(os.path.join(folder, f"{os.getpid()}.txt"), "w") as f:
            f.write("\n".join(sorted(files)))


atexit.register(_at_exit)

if os.environ.get("MINISGL_BOOK_RECORD"):  # tools/steps.py records what each test runs
    import book_record

    book_record.install(_TREE, _PKG, os.environ["MINISGL_BOOK_RECORD"])


def _open_stacks():
    """<folder>/<pid>.txt for this process's stacks; again in a forked child, which is
    another process (a fork server's workers, tools/warm_forkserver.py's copy)."""
    global _STACKS
    _STACKS = open(os.path.join(os.environ["MINISGL_BOOK_STACKS"], f"{os.getpid()}.txt"), "w")
    _STACKS.write(" ".join(sys.argv) + "\n")
    _STACKS.flush()
    faulthandler.register(signal.SIGUSR1, file=_STACKS, all_threads=True)


if os.environ.get("MINISGL_BOOK_STACKS") and hasattr(signal, "SIGUSR1"):
    _open_stacks()
    os.register_at_fork(after_in_child=_open_stacks)


def _fork_server_on_demand():
    """A fork server spawned by a process with one thread is a fork of that process
    (tools/warm_forkserver.py): `python -m minisgl` has imported torch and transformers by then."""
    import importlib.util

    module = sys.modules.get("book_warm_forkserver")  # tools/preload.py's, when it made this
    if module is None:
        path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "warm_forkserver.py")
        spec = importlib.util.spec_from_file_location("book_warm_forkserver", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["book_warm_forkserver"] = module
    module.fork_on_demand()


_fork_server_on_demand()
