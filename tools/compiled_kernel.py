"""What Triton's compiler makes of the book's decode kernel for a Hopper GPU, on any machine.

    python tools/bench_p1.py compiled    # docs/data/p1-decode-compiled{,-stages}.md

Triton compiles for a target it is told, GPU or not: here the H100's and H200's (compute
capability 9.0). The pieces' kernel (`_decode_piece_kernel`) is compiled with the engine's
settings (`TRITON_DECODE_SETTINGS` in minisgl/attention/fi.py, pages of 256 slots as in the
workload) at Qwen3-0.6B's shape: two query heads per key/value head, head_dim 128. The table
gives, for the pieces' results in float32 (the engine's) and in bfloat16 (`narrow_parts`):
the registers per thread and the shared memory per program (from the cubin), how many
programs fit on one SM by each of the two, and the memory and matrix instructions of the
PTX, counted as written (a loop's body once).

A launch from Python tells the compiler more than the types: Triton's JIT marks every pointer
that is 16-byte aligned and every integer argument that is a multiple of 16 (the engine's
strides are 4,096, 1,024 and 128 elements), and only with those marks may it load or store 16
bytes at once. The last column compiles the float32 form without the marks, to show what they
change. The counts depend on Triton's version; the table says which one compiled it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "data" / "p1-decode-compiled.md"

# Qwen3-0.6B's attention: query heads per key/value head, and the head's size
GROUP, HEAD_DIM, WORKLOAD_PAGE_SIZE = 2, 128, 256


@dataclass(frozen=True)
class SmLimits:
    """One SM of a Hopper GPU (NVIDIA's CUDA occupancy rules for compute capability 9.0)."""

    registers: int = 65536
    register_unit: int = 256  # registers are given to a warp in units of this many
    shared_bytes: int = 233472  # 228 KB
    shared_reserved: int = 1024  # per program, kept by the system
    warps: int = 64


HOPPER = SmLimits()


@dataclass(frozen=True)
class Compiled:
    registers: int  # per thread
    shared_bytes: int  # per program
    warps: int
    key_buffers: int  # loads of keys the shared memory holds at once (Triton's pipeline depth)
    ptx: str


# the PTX instructions the table counts, by what they do
INSTRUCTIONS: Dict[str, str] = {
    "copies to shared memory, 16 bytes (cp.async.cg)": r"cp\.async\.cg\.shared\.global",
    "copies to shared memory, 4 bytes (cp.async.ca)": r"cp\.async\.ca\.shared\.global",
    "loads, 16 bytes (ld.global.v4)": r"ld\.global(?:\.[a-z]+)*\.v4\.",
    "loads, one number (ld.global)": r"ld\.global(?:\.[a-z]+)*\.b(?:16|32)\b",
    "stores, 16 bytes (st.global.v4)": r"st\.global(?:\.[a-z]+)*\.v4\.",
    "stores, one number (st.global)": r"st\.global(?:\.[a-z]+)*\.b(?:16|32)\b",
    "tensor-core products (mma.sync)": r"mma\.sync\.",
}


def count_instructions(ptx: str) -> Dict[str, int]:
    """How many times each kind of INSTRUCTIONS is written in `ptx` (comments left out)."""
    code = "\n".join(line.split("//")[0] for line in ptx.splitlines())
    return {name: len(re.findall(pattern, code)) for name, pattern in INSTRUCTIONS.items()}


def programs_per_sm(compiled: Compiled, sm: SmLimits = HOPPER) -> Dict[str, int]:
    """How many programs one SM holds at once, by each of its limits."""
    per_warp = -(-compiled.registers * 32 // sm.register_unit) * sm.register_unit
    return {
        "registers": sm.registers // (per_warp * compiled.warps),
        "shared memory": sm.shared_bytes // (compiled.shared_bytes + sm.shared_reserved),
        "warps": sm.warps // compiled.warps,
    }


def compile_pieces(
    narrow_parts: bool,
    aligned: bool = True,
    page_loop: bool = False,
    stages: int | None = None,
    block_n: int | None = None,
) -> Compiled:
    """The pieces' kernel, compiled for compute capability 9.0 with the engine's settings
    (`page_loop`: with that option on; `stages`, `block_n`: those instead of the engine's)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from minisgl.attention.fi import TRITON_DECODE_SETTINGS
    from minisgl.kernel.triton.decode_attention import _decode_piece_kernel as kernel
    from minisgl.kernel.triton.decode_attention import piece_constants

    settings = dict(TRITON_DECODE_SETTINGS, page_loop=page_loop)
    settings["num_stages"] = stages or settings["num_stages"]
    settings["block_n"] = block_n or settings["block_n"]
    constants = piece_constants(
        GROUP, HEAD_DIM, splits=settings["splits"], chunk=settings["chunk"],
        block_n=settings["block_n"], equal=settings["equal"], merge_here=settings["merge_here"],
        page_size=WORKLOAD_PAGE_SIZE if settings["page_runs"] else 1, tma=settings["tma"],
        page_loop=settings["page_loop"], heads_first=settings["heads_first"],
    )  # fmt: skip
    constants["UPCAST"] = False  # compiled for the GPU, whatever this process interprets
    pointers = dict(
        q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", indptr_ptr="*i32", indices_ptr="*i32",
        part_o_ptr="*bf16" if narrow_parts else "*fp32", part_lse_ptr="*fp32",
        out_ptr="*bf16", counter_ptr="*i32",
    )  # fmt: skip
    signature: Dict[str, str] = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        else:  # the rest are the scale (a float) and strides (integers)
            signature[name] = pointers.get(name, "fp32" if name == "scale_log2" else "i32")
    marked = [n for n, t in signature.items() if t.startswith("*") or t == "i32"]
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in marked}
    source = ASTSource(kernel, signature, constants, attrs if aligned else None)
    with tempfile.TemporaryDirectory() as cache:
        triton.knobs.cache.dir = cache  # a compile of its own, never one cached by a GPU run
        binary = triton.compile(
            source,
            target=GPUTarget("cuda", 90, 32),
            options=dict(num_warps=settings["num_warps"], num_stages=settings["num_stages"]),
        )
        registers = cubin_registers(binary.asm["cubin"], Path(cache))
    tile = f"x{settings['block_n']}x{HEAD_DIM}xbf16"
    buffers = re.findall(rf"local_alloc : \(\) -> !ttg\.memdesc<(\d+){tile}", binary.asm["ttgir"])
    return Compiled(
        registers,
        binary.metadata.shared,
        binary.metadata.num_warps,
        max((int(b) for b in buffers), default=0),
        binary.asm["ptx"],
    )


def cubin_registers(cubin: bytes, work: Path) -> int:
    """Registers per thread of the one kernel in `cubin`, as cuobjdump (shipped with Triton)
    reports them."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    path = work / "kernel.cubin"
    path.write_bytes(cubin)
    report = subprocess.run(
        [str(tool), "--dump-resource-usage", str(path)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    found = re.search(r"REG:(\d+)", report)
    assert found, report
    return int(found.group(1))


def table(columns: Dict[str, Compiled]) -> str:
    """The table of `compiled`: a column per compiled form."""
    import triton

    from minisgl.attention.fi import TRITON_DECODE_SETTINGS

    labels = list(columns)
    rows = ["| | " + " | ".join(labels) + " |", "| --- |" + " ---: |" * len(labels)]

    def row(name: str, cells: List[object]) -> None:
        rows.append(f"| {name} | " + " | ".join(f"{c:,}" if isinstance(c, int) else str(c)
                                              for c in cells) + " |")  # fmt: skip

    row("registers per thread", [c.registers for c in columns.values()])
    row("shared memory per program, bytes", [c.shared_bytes for c in columns.values()])
    row("loads of keys held in shared memory", [c.key_buffers for c in columns.values()])
    fits = {label: programs_per_sm(c) for label, c in columns.items()}
    for limit in ("registers", "shared memory"):
        row(f"programs per SM, by {limit}", [fits[label][limit] for label in labels])
    counts = {label: count_instructions(c.ptx) for label, c in columns.items()}
    for name in INSTRUCTIONS:
        row(name, [counts[label][name] for label in labels])
    settings = "; ".join(f"{k}={v}" for k, v in TRITON_DECODE_SETTINGS.items())
    return (
        "\n".join(rows) + f"\n\nThe decode kernel's pieces (`_decode_piece_kernel`) compiled by "
        f"Triton {triton.__version__} for compute capability 9.0 (H100, H200), "
        f"{next(iter(columns.values())).warps} warps a program, with the engine's settings "
        f"({settings}) and pages of {WORKLOAD_PAGE_SIZE} slots, at Qwen3-0.6B's shape ({GROUP} "
        f"query heads per key/value head, head_dim {HEAD_DIM}). Instructions are counted as the "
        "PTX writes them, not as they run. Programs per SM: 64K registers given out 256 to a "
        "warp, 228 KB of shared memory less 1 KB per program. Made by `python "
        "tools/bench_p1.py compiled`, no GPU needed.\n"
    )


def stages_table(loops: Dict[str, Dict[int, Compiled]]) -> str:
    """Per loop and number of stages: the loads of keys in shared memory, its bytes, and the
    programs an SM holds."""
    stages = sorted(next(iter(loops.values())))
    rows = ["| loop | " + " | ".join(f"{n} stages" for n in stages) + " |"]
    rows.append("| --- |" + " ---: |" * len(stages))
    for label, by_stages in loops.items():
        cells = []
        for n in stages:
            c = by_stages[n]
            fits = min(programs_per_sm(c).values())
            cells.append(f"{c.key_buffers} ({c.shared_bytes:,} bytes, {fits} per SM)")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return (
        "\n".join(rows) + "\n\nLoads of keys held in shared memory at once (as many for the "
        "values), the program's shared memory, and the programs one SM holds by its registers, "
        "shared memory and warps: the float32 pieces compiled as in p1-decode-compiled.md, with "
        "2, 3 and 4 stages (`num_stages`), and 64 keys a load unless the row says otherwise.\n"
    )


def compiled(out: Path = OUT) -> None:
    """The table for the float32 and bfloat16 pieces, the float32 ones with the page loop, and
    without the marks."""
    columns = {
        "float32 pieces (the engine's)": compile_pieces(narrow_parts=False),
        "bfloat16 pieces": compile_pieces(narrow_parts=True),
        "float32 pieces, page loop": compile_pieces(narrow_parts=False, page_loop=True),
        "float32 pieces, no alignment marks": compile_pieces(narrow_parts=False, aligned=False),
    }
    loops = {
        label: {
            n: compile_pieces(narrow_parts=False, page_loop=loop, stages=n, block_n=keys)
            for n in (2, 3, 4)
        }
        for label, loop, keys in (
            ("the engine's (page runs)", False, None),
            ("page loop", True, None),
            ("page loop, 32 keys a load", True, 32),
        )
    }
    out.write_text(table(columns))
    stages_out = stages_file(out)
    stages_out.write_text(stages_table(loops))
    print(out.read_text() + "\n" + stages_out.read_text())


def stages_file(out: Path) -> Path:
    """Where `compiled` writes its second table: beside `out`, named after it."""
    return out.with_name(f"{out.stem}-stages{out.suffix}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    compiled(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
