"""Building the kernels just in time, with tvm-ffi (like upstream).

A kernel file under ``csrc/jit/`` is a C++ template; `load_jit` instantiates it for the sizes a
call needs (the row size in bytes, the threads per block ...), compiles it once and loads the
library. ``csrc/src/`` holds plain C++ that `load_aot` builds the same way. tvm-ffi's
`load_inline` runs the compiler (through ninja) and exposes the exported functions, which take
PyTorch tensors directly (through DLPack, without a copy).

Where it compiles: for a GPU, nvcc builds the file as CUDA; on a CPU, the host compiler builds
the same file against ``minisgl/sim.h``, which runs the kernel thread by thread on the CPU.
A build is cached under ``$TVM_FFI_CACHE_DIR`` (default ``~/.cache/tvm-ffi``) in a folder named
after a hash of everything that goes into it: the sources, the headers, the flags and the
device, so an edited kernel is rebuilt and every copy of the tree shares one build.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pathlib
import shutil
import tempfile
from typing import TYPE_CHECKING, List, NamedTuple, Tuple, Union

from minisgl.env import ENV

if TYPE_CHECKING:
    from tvm_ffi import Module

KERNEL_PATH = pathlib.Path(__file__).parent / "csrc"
DEFAULT_INCLUDE = [str(KERNEL_PATH / "include")]
DEFAULT_CFLAGS = ["-std=c++20", "-O2"]
DEFAULT_CUDA_CFLAGS = ["-std=c++20", "-O3", "--expt-relaxed-constexpr"]
CPP_TEMPLATE_TYPE = Union[int, float, bool]


class KernelConfig(NamedTuple):
    num_threads: int  # threads per block


class CppArgList(List[str]):
    def __str__(self) -> str:
        return ", ".join(self)


def make_cpp_args(*args: CPP_TEMPLATE_TYPE) -> CppArgList:
    """Python values as C++ template arguments: `IndexKernel<{args}>`."""

    def convert(arg: CPP_TEMPLATE_TYPE) -> str:
        if isinstance(arg, bool):
            return "true" if arg else "false"
        if isinstance(arg, (int, float)):
            return str(arg)
        raise TypeError(f"a C++ template argument must be an int, float or bool, not {arg!r}")

    return CppArgList(convert(arg) for arg in args)


def _make_name(*args: str) -> str:
    return "minisgl__" + "_".join(args)


def _make_wrapper(export_name: str, function: str) -> str:
    return f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({export_name}, ({function}));"


def _build_directory(name: str, sources: List[str], flags: List[str]) -> pathlib.Path:
    digest = hashlib.sha256()
    for text in sources + flags:
        digest.update(text.encode())
    for header in sorted(KERNEL_PATH.glob("include/**/*")):
        if header.is_file():
            digest.update(header.read_bytes())
    root = os.environ.get("TVM_FFI_CACHE_DIR") or pathlib.Path.home() / ".cache" / "tvm-ffi"
    return pathlib.Path(root) / "minisgl" / f"{name}_{digest.hexdigest()[:16]}"


def _headers_in(build: pathlib.Path) -> pathlib.Path:
    """The headers of DEFAULT_INCLUDE, copied once into the build folder (whose name already
    hashes them). Compiled against this copy, a build's commands name no path of the tree, so
    another copy of the tree finds the build up to date; with the tree's own include path,
    ninja would see a changed command and compile again in every copy."""
    include = build / "include"
    if not include.is_dir():
        build.mkdir(parents=True, exist_ok=True)
        staging = pathlib.Path(tempfile.mkdtemp(prefix="include-", dir=build))
        for folder in DEFAULT_INCLUDE:
            shutil.copytree(folder, staging, dirs_exist_ok=True)
        try:
            staging.rename(include)
        except OSError:  # another process put the same files there first
            shutil.rmtree(staging, ignore_errors=True)
    return include


def _load(name: str, sources: List[str], *, cuda: bool) -> Module:
    from tvm_ffi.cpp import load_inline

    flags = DEFAULT_CUDA_CFLAGS if cuda else DEFAULT_CFLAGS
    build = _build_directory(name, sources, flags + [f"cuda={cuda}"])
    # tvm-ffi holds a file lock in the folder while it builds: two processes (pytest's
    # workers, steps.py's jobs) never build one kernel at once
    return load_inline(
        name,
        cpp_sources=None if cuda else sources,
        cuda_sources=sources if cuda else None,
        extra_cflags=DEFAULT_CFLAGS,
        extra_cuda_cflags=DEFAULT_CUDA_CFLAGS,
        extra_include_paths=[str(_headers_in(build))],
        build_directory=str(build),
    )


def load_jit(
    *args: str, cuda_files: List[str], cuda_wrappers: List[Tuple[str, str]], cuda: bool
) -> Module:
    """Compile the files of ``csrc/jit/`` with the wrappers that export each
    (name, C++ function) pair, as CUDA when `cuda` is set, else for the simulator."""
    sources = [(KERNEL_PATH / "jit" / f).read_text() for f in cuda_files]
    sources += [_make_wrapper(*pair) for pair in cuda_wrappers]
    return _load(_make_name(*args, "cuda" if cuda else "sim"), sources, cuda=cuda)


def load_aot(*args: str, cpp_files: List[str]) -> Module:
    """Compile host C++ files of ``csrc/src/`` (they export their functions themselves)."""
    sources = [(KERNEL_PATH / "src" / f).read_text() for f in cpp_files]
    return _load(_make_name(*args), sources, cuda=False)


def chunk_bytes(*sizes: int) -> int:
    """The widest load (16, 8 or 4 bytes) that every size (a row's bytes, strides in bytes,
    addresses) is a multiple of: a vector load must be aligned to its width."""
    for unit in (16, 8, 4):
        if all(size % unit == 0 for size in sizes):
            return unit
    raise ValueError(f"the kernels copy rows in chunks of 4 bytes at least, not {sizes}")


@functools.cache
def compiler_available() -> bool:
    """Whether a C++ compiler and tvm-ffi are there to build the CPU simulation."""
    try:
        import tvm_ffi.cpp  # noqa: F401
    except ImportError:
        return False
    return shutil.which(os.environ.get("CXX", "c++")) is not None


def use_custom_kernels(cuda: bool) -> bool:
    """Whether the engine runs the book's kernels, or their PyTorch references: on a GPU always,
    on a CPU where the simulation can be built; never with MINISGL_DISABLE_CUSTOM_KERNELS=1."""
    if ENV.DISABLE_CUSTOM_KERNELS:
        return False
    return cuda or compiler_available()


def load_source(name: str, source: str, wrapper: str, *, cuda: bool = False) -> Module:
    """Build kernel source given as text, with one line of export (the chapter's main builds
    deliberately broken copies of the kernels this way)."""
    return _load(_make_name(name, "cuda" if cuda else "sim"), [source, wrapper], cuda=cuda)
