"""Shared fixtures. The same file runs at the repository root (against the finished package)
and inside every chapter's tree built by tools/steps.py (against that chapter's package)."""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from pathlib import Path
from typing import Callable, Iterator, List

import pytest
import torch

if not torch.cuda.is_available():
    # Triton's kernels run on a CPU only in its interpreter, chosen when triton.language is
    # first imported (transformers' model code imports it): before any test file is collected
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.support import left_out  # noqa: E402
from tests.support.watchdog import TEST_TIMEOUT_S, Watchdog, leftovers, stop_all_children  # noqa: E402
from tools.models import ensure_model  # noqa: E402
from tools.processes import describe  # noqa: E402
from tools.warm_forkserver import install as install_warm_forkserver  # noqa: E402
from tools.warm_launch import install as install_warm_launch  # noqa: E402

# the servers and shells that tests start: forks of a copy of this process, made now, while
# it has one thread and has not imported the package (tools/warm_launch.py); first, so that
# the copy holds nothing of the fork server's copy below
install_warm_launch()
# the fork server of the workers that tests start: a copy of this process, which has imported
# torch already, instead of a fresh interpreter that imports it again (tools/warm_forkserver.py)
install_warm_forkserver()

IN_CHAPTER_TREE = "MINISGL_BOOK_CHAPTER" in os.environ
# The tests are written for the CPU: they compare with transformers there. The mains follow
# the GPU when there is one (tools/parity.py).
os.environ["MINISGL_DEVICE"] = "cpu"
os.environ["MINISGL_BOOK_DEVICE"] = "cpu"


def _retired() -> dict:
    """At the repository root, tests that a chapter's manifest retires do not run."""
    if IN_CHAPTER_TREE or not (ROOT / "chapters" / "book.toml").exists():
        return {}
    from tools.book import Book

    return Book(ROOT).retired_tests()


_RETIRED = _retired()


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    try:
        rel = collection_path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return None
    return True if rel in _RETIRED else None


@pytest.fixture(scope="session")
def model_path() -> Callable[[str], Path]:
    """model_path("tiny-qwen3") -> the folder of that reference model (built on first use);
    the test is skipped if the book's settings leave that model out (MINISGL_BOOK_MODELS)."""

    def find(name: str) -> Path:
        if left_out(name):
            pytest.skip(
                f"{name} is left out by MINISGL_BOOK_MODELS={os.environ.get('MINISGL_BOOK_MODELS')}"
            )
        return ensure_model(name)

    return find


def tiny_model_names() -> List[str]:
    """The dense tiny models, which every chapter runs (the MoE model needs chapter 20)."""
    from tools.models import MOE_MODEL, TINY_MODELS

    return [name for name in TINY_MODELS if name != MOE_MODEL]


# ------------------------------------------------------------ several test processes
MAX_TEST_WORKERS = 4  # each worker loads torch and its own models: more would cost memory


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which the tools switch off
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many worker processes `-n auto` (pyproject.toml) starts: one per core, at most
    MAX_TEST_WORKERS."""
    return max(1, min(MAX_TEST_WORKERS, _cores()))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# The longest test files, whose tests make nothing at module scope: xdist may give their tests to
# different workers, one by one. Every other file goes whole to one worker (`--dist loadgroup`
# in pyproject.toml, one group per file), so that its module-scoped server or models are made
# once. Whole, test_tools_steps.py alone kept one worker busy for 4 minutes here after the other
# had run out of files (7m14s for the run on a slow 2-core machine; with its tests spread, 6m17s).
SPREAD_FILES = frozenset(
    {"test_tools_steps.py", "test_p1_performance.py", "test_tools_benchmark_scripts.py"}
)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups off the tests
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):  # the tools run one process, no groups
        return
    for item in items:
        if item.path.name not in SPREAD_FILES:
            item.add_marker(pytest.mark.xdist_group(item.path.name))


if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    # A worker shares the cores with the others: with as many threads as cores each, they would
    # spin waiting for one another (the whole run took twice as long here). What a test starts
    # inherits the setting.
    _threads = max(1, _cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(_threads)
    import torch

    torch.set_num_threads(_threads)


# ------------------------------------------------------------ no hang, nothing left behind
_REAL_STDERR: List[int] = []  # a copy of the terminal's stderr, past pytest's capture


def pytest_configure(config: pytest.Config) -> None:
    # hypothesis looks for the referrers of a random generator that a library registers with
    # gc.get_referrers, which does not see frozen objects (pytest_collection_finish below)
    ignored = "ignore:It looks like `register_random`:hypothesis.errors.HypothesisWarning"
    config.addinivalue_line("filterwarnings", ignored)
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is None:
        _REAL_STDERR.append(os.dup(2))
        return
    with capture.global_and_fixture_disabled():
        _REAL_STDERR.append(os.dup(2))


def pytest_collection_finish(session: pytest.Session) -> None:
    # What is loaded by now (torch, transformers, the test modules) stays to the end. Frozen, it
    # is out of the garbage collector's sight: the full collection that an engine runs when it
    # shuts down (minisgl/engine/graph.py) then walks only what the tests made since, instead
    # of 0.2-0.5 s over the libraries' half a million objects, for each engine a test makes.
    gc.collect()
    gc.freeze()
    _FROZEN_MODULES[0] = len(sys.modules)


_FROZEN_MODULES = [0]  # how many modules were loaded when the objects were last frozen
REFREEZE_MODULES = 20


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    # A test that loads a library lazily (transformers' code for a model family, sympy behind
    # torch's symbolic shapes, triton, accelerate) leaves its hundreds of thousands of objects
    # where every later full collection walks them: test_ch11_overlap.py had 66 of them, 7 s
    # of its 19. Once that many modules came since the last freeze, what lives is frozen too.
    if len(sys.modules) - _FROZEN_MODULES[0] >= REFREEZE_MODULES:
        gc.collect()
        gc.freeze()
        _FROZEN_MODULES[0] = len(sys.modules)


def pytest_unconfigure(config: pytest.Config) -> None:
    gc.unfreeze()  # frozen objects are never freed: extension modules would report them leaked


@pytest.fixture(autouse=True)
def _bounded_and_tidy(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test ends within TEST_TIMEOUT_S and stops every process it started."""
    before = set(multiprocessing.active_children())
    watchdog = Watchdog(request.node.nodeid, TEST_TIMEOUT_S, _REAL_STDERR[0])
    yield
    watchdog.cancel()
    left = leftovers(before)
    if left:
        pytest.fail(f"the test left {', '.join(map(describe, left))} running (now stopped)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    stopped = stop_all_children()  # else multiprocessing's exit handler would wait for them
    if stopped:
        os.write(
            _REAL_STDERR[0], f"\nstopped at the end: {', '.join(map(describe, stopped))}\n".encode()
        )


@pytest.fixture(autouse=True)
def _fresh_global_state() -> Iterator[None]:
    """A test that fails half-way may leave an engine's global context behind; clear it, so
    that one failure does not cascade into the next tests. Only what a test has loaded can
    hold such state, so nothing is imported here (and no test depends on these modules
    through this fixture: tools/deps.py reads the imports)."""
    yield
    core, distributed = sys.modules.get("minisgl.core"), sys.modules.get("minisgl.distributed")
    if core is not None and hasattr(core, "clear_global_ctx"):
        core.clear_global_ctx()
    if distributed is not None and hasattr(distributed, "reset_tp_info"):
        distributed.reset_tp_info()
