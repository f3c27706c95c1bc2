"""Helpers shared by the chapters' tests. Nothing here imports minisgl at module level."""

from __future__ import annotations

from pathlib import Path

from tools.parity import load_example

TREE_ROOT = Path(__file__).resolve().parents[2]

__all__ = ["TREE_ROOT", "load_example"]
