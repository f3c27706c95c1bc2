"""Helpers shared by the chapters' tests. Nothing here imports minisgl at module level."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

TREE_ROOT = Path(__file__).resolve().parents[2]


def load_example(relative_path: str) -> ModuleType:
    """Import a chapter's main (examples/chNN_*.py) as a module, without running main()."""
    path = TREE_ROOT / relative_path
    name = f"book_example_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"cannot load {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
