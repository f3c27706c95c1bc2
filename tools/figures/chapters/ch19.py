"""Figures of chapter 19 (CUDA kernels).

ch19-two-builds   one kernel source, two builds: load_jit instantiates csrc/jit/store.cu's templates
                  for a call's sizes and tvm-ffi's load_inline builds it once (cached by a hash of
                  the sources, the headers and the flags); on a GPU nvcc compiles it as CUDA and
                  LaunchKernel launches kernel<<<grid, block, 0, stream>>> on PyTorch's stream; on
                  a CPU the host compiler compiles it with minisgl/sim.h and sim::launch runs the
                  grid block after block, a block's threads one at a time as fibers; both end in
                  the same module.launch(k_cache, v_cache, indices, k, v)
ch19-store-warps  how store.cu maps work to threads: 6 tokens, blocks of 128 threads (4 warps),
                  2 blocks; warp w copies token w's key and value rows to row indices[w] of the
                  caches, the last block's two spare warps return; one warp's row of 2 KiB as 128
                  chunks of 16 bytes, lane l taking chunks l, l + 32, l + 64, l + 96; below, the
                  warp number without blockIdx.x * 4: tokens 4 and 5 are never stored
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tools.figures.svg import BLUE, CYAN, GREY, ORANGE, PURPLE, RED, Svg, text_width

SOURCE = GREY  # the kernel's source file
PYTHON = BLUE  # the Python side: store.py, load_jit, the module's call
BUILD = CYAN  # tvm-ffi's build and its cache
GPU = PURPLE  # nvcc, a launch on the GPU, a warp's work
CPU = ORANGE  # the host compiler and the simulator
CACHE = CYAN  # the KV cache's rows
CODE = 12  # the size of code lines
CODE_GAP = 1.4

# ch19-store-warps: six tokens of a prefill and the slots the scheduler gave them
INDICES = [17, 3, 40, 8, 21, 5]
WARP_THREADS = 32
WARPS_PER_BLOCK = 4  # 128 threads a block
NUM_SLOTS = 48  # the cache rows drawn
CHUNKS = 128  # a row of 2 KiB (8 KV heads x 128 dims x 2 bytes) in chunks of 16 bytes
LANE = 5  # the lane whose chunks are marked


def _code(s: Svg, x: float, y: float, rows: Sequence[str], **kw: Any) -> float:
    """Lines of code from baseline ``y``, indented by their leading spaces; returns the next
    baseline. (An offset rather than spaces: some renderers drop leading white space.)"""
    size = kw.pop("size", CODE)
    for row in rows:
        code = row.lstrip(" ")
        indent = text_width(" " * (len(row) - len(code)), size, mono=True)
        s.text(x + indent, y, code, size=size, mono=True, **kw)
        y += size * CODE_GAP
    return y


# --------------------------------------------------------------------------- two builds


def fig_two_builds() -> str:
    s = Svg(
        "ch19-two-builds",
        940,
        736,
        "One kernel source, two builds",
        "The file minisgl/kernel/csrc/jit/store.cu holds a kernel template, store_kv_cache, and "
        "a host function, StoreKernel<row bytes, chunk bytes, threads>::run, which checks its "
        "arguments and launches the kernel. The Python side, store_cache in "
        "minisgl/kernel/store.py, takes the sizes of the call (2,048-byte rows, 16-byte chunks, "
        "128 threads a block) and calls load_jit, which reads the file and adds one line "
        "exporting StoreKernel<2048, 16, 128>::run as launch. tvm-ffi's load_inline builds it "
        "with ninja, once: the build folder is named after a hash of the sources, the headers "
        "and the flags. Then two paths. On a GPU, nvcc compiles the file as CUDA, and "
        "LaunchKernel runs kernel<<<grid, block, 0, stream>>> on PyTorch's current stream: the "
        "blocks run at once. On a CPU, the host compiler (g++ or clang++) compiles the same "
        "file with minisgl/sim.h, which defines threadIdx, blockIdx, blockDim, gridDim, "
        "__syncthreads, __shfl_xor_sync, __shared__ and the rest, and sim::launch runs the grid "
        "block after block, the threads of a block one at a time as fibers, each on its own "
        "stack, switching only at a barrier. Both paths end in the same Python call, "
        "module.launch(k_cache, v_cache, indices, k, v), which takes PyTorch tensors through "
        "DLPack without a copy.",
    )
    s.text(20, 28, "One kernel source, two builds", size=15, bold=True)

    # ---- the source file: a device template and a host function
    top, src_x, src_w, src_h = 52, 20, 440, 190
    s.box(src_x, top, src_w, src_h, SOURCE, fill_opacity=0.1)
    s.text(
        src_x + 16, top + 24, "minisgl/kernel/csrc/jit/store.cu", size=13.5, bold=True, mono=True
    )
    inner_x, inner_w = src_x + 12, src_w - 24

    def part(y: float, h: float, color: str, rows: Sequence[str], note: str, what: str) -> None:
        s.box(inner_x, y, inner_w, h, color, rx=6, fill_opacity=0.14, stroke_width=1.1)
        _code(s, inner_x + 10, y + 20, rows)
        s.text(
            inner_x + inner_w - 10, y + 20, note, size=12.5, anchor="end", bold=True, color=color
        )
        s.text(inner_x + 10, y + h - 10, what, size=12, muted=True)

    part(
        top + 38,
        66,
        GPU,
        ["template <kNumThreads, kRowBytes,", "          kUnit, Index>"],
        "the kernel",
        "__global__ store_kv_cache(params): a warp per token",
    )
    part(
        top + 112,
        66,
        CPU,
        ["template <kRowBytes, kUnit, kNumThreads>", "struct StoreKernel { static void run(...) }"],
        "the host",
        "checks the tensors, then LaunchKernel(blocks, 128)",
    )

    # ---- the Python side: this call's sizes, load_jit
    py_x, py_w = 510, 410
    s.box(py_x, top, py_w, src_h, PYTHON, fill_opacity=0.12)
    s.text(py_x + 16, top + 24, "minisgl/kernel/store.py", size=13.5, bold=True, mono=True)
    s.text(py_x + py_w - 16, top + 24, "Python", size=12.5, anchor="end", bold=True, color=PYTHON)
    _code(
        s,
        py_x + 16,
        top + 50,
        [
            "def store_cache(k_cache, v_cache, indices, k, v):",
            "  args = make_cpp_args(2048, 16, 128)",
            '  load_jit("store", *args,',
            '           cuda_files=["store.cu"],',
            '           cuda_wrappers=[("launch",',
            '             f"StoreKernel<{args}>::run")],',
            "           cuda=k_cache.is_cuda)",
        ],
    )
    s.text(
        py_x + 16,
        top + src_h - 12,
        "this call's sizes: 2 KiB rows, 16-byte chunks, 128 threads",
        size=12,
        muted=True,
    )
    s.arrow(py_x - 4, top + 86, src_x + src_w + 4, top + 86, color=PYTHON, width=1.4)
    s.text((src_x + src_w + py_x) / 2, top + 78, "reads", size=12, anchor="middle", muted=True)

    # ---- tvm-ffi builds it, once
    by, bh = top + src_h + 38, 80
    s.arrow(src_x + src_w / 2, top + src_h + 3, src_x + src_w / 2, by - 3, width=1.4)
    s.arrow(py_x + py_w / 2, top + src_h + 3, py_x + py_w / 2, by - 3, width=1.4)
    s.label_bg(src_x + src_w / 2, top + src_h + 24, "the source", size=12, muted=True)
    s.label_bg(py_x + py_w / 2, top + src_h + 24, "+ one export line", size=12, muted=True)
    s.box(20, by, 900, bh, BUILD, fill_opacity=0.14)
    s.text(
        36,
        by + 24,
        "tvm-ffi's load_inline: compiled with ninja, loaded as a module",
        size=14,
        bold=True,
    )
    _code(
        s,
        36,
        by + 46,
        ["TVM_FFI_DLL_EXPORT_TYPED_FUNC(launch, (StoreKernel<2048, 16, 128>::run));"],
    )
    s.text(
        36,
        by + 67,
        "built once, in ~/.cache/tvm-ffi/minisgl/<name>_<hash>, a hash of the sources, "
        "the headers and the flags",
        size=12.5,
        muted=True,
    )

    # ---- the two paths
    cy, ch = by + bh + 38, 236
    gx, gw = 20, 440
    cx, cw = 480, 440
    for x, w, label in ((gx, gw, "cuda=True"), (cx, cw, "cuda=False")):
        s.arrow(x + w / 2, by + bh + 3, x + w / 2, cy - 3, width=1.4)
        s.text(x + w / 2 + 10, by + bh + 24, label, size=12, mono=True)
    dy = cy + 134  # the little timelines' first row
    arrow_y = dy + 50

    def time_arrow(x1: float, x2: float) -> None:
        s.arrow(x1, arrow_y, x2, arrow_y, color=GREY, width=1.2)
        s.text(x2 + 6, arrow_y + 4, "time", size=12, muted=True)

    def thread_box(x: float, y: float, w: float, label: str, color: str, mono: bool) -> None:
        s.box(x, y, w, 20, color, rx=3, fill_opacity=0.3, stroke_width=1)
        s.text(x + w / 2, y + 14.5, label, size=12, anchor="middle", mono=mono)

    # the GPU: nvcc, a real launch, the blocks at once
    s.box(gx, cy, gw, ch, GPU, fill_opacity=0.12)
    s.text(gx + 16, cy + 26, "on a GPU: nvcc", size=14.5, bold=True, color=GPU)
    s.text(gx + 16, cy + 48, "compiles the file as CUDA (__CUDACC__ is defined)", size=12.5)
    _code(
        s,
        gx + 16,
        cy + 72,
        ["LaunchKernel(...)(kernel, params) runs", "kernel<<<grid, block, 0, stream>>>(params)"],
    )
    s.text(
        gx + 16, cy + 112, "on PyTorch's current stream (TVMFFIEnvGetStream)", size=12.5, muted=True
    )
    tx, pitch = gx + 80, 56
    for b in range(2):
        y = dy - 10 + b * 26
        s.text(tx - 10, y + 15, f"block {b}", size=12, anchor="end", muted=True)
        for w in range(WARPS_PER_BLOCK):
            thread_box(tx + w * pitch, y, pitch - 4, f"warp {w}", GPU, mono=False)
    time_arrow(gx + 16, tx + 4 * pitch + 60)
    s.lines(
        gx + 16,
        arrow_y + 22,
        ["the blocks at once, on the GPU's many SMs;", "a warp's 32 lanes in step"],
        size=12.5,
        muted=True,
    )

    # the CPU: the host compiler with sim.h, the blocks one after another
    s.box(cx, cy, cw, ch, CPU, fill_opacity=0.12)
    s.text(cx + 16, cy + 26, "on a CPU: g++ / clang++ with sim.h", size=14.5, bold=True, color=CPU)
    s.text(cx + 16, cy + 48, "minisgl/sim.h defines what nvcc would provide:", size=12.5)
    _code(
        s,
        cx + 16,
        cy + 72,
        ["threadIdx, blockIdx, blockDim, gridDim,", "__syncthreads, __shfl_xor_sync, __shared__ …"],
    )
    s.text(cx + 16, cy + 112, "LaunchKernel(...) calls sim::launch(grid, block, body)", size=12.5)
    x = float(cx + 16)
    fy = dy + 8
    for b in range(2):
        start = x
        for name in ("t0", "t1", "t2", "⋯", "t127"):
            if name == "⋯":
                s.text(x + 9, fy + 15, name, size=14, anchor="middle", bold=True, muted=True)
                x += 20
                continue
            w = 36 if name == "t127" else 28
            thread_box(x, fy, w, name, CPU, mono=True)
            x += w + 2
        s.text((start + x) / 2, fy - 10, f"block {b}", size=12, anchor="middle", muted=True)
        x += 16
    time_arrow(cx + 16, x + 8)
    s.lines(
        cx + 16,
        arrow_y + 22,
        [
            "block after block; a block's threads one at a time, each a",
            "fiber with its own stack, switching only at a barrier",
        ],
        size=12.5,
        muted=True,
    )

    # ---- the same call on both
    my, mh = cy + ch + 38, 58
    mx, mw = 170, 600
    for x, w in ((gx, gw), (cx, cw)):
        s.arrow(x + w / 2, cy + ch + 3, x + w / 2, my - 3, width=1.4)
    s.box(mx, my, mw, mh, PYTHON, fill_opacity=0.14)
    s.text(
        mx + mw / 2,
        my + 24,
        "module.launch(k_cache, v_cache, indices, k, v)",
        size=14,
        anchor="middle",
        bold=True,
        mono=True,
    )
    s.text(
        mx + mw / 2,
        my + 45,
        "the same Python call: PyTorch tensors through DLPack, without a copy",
        size=12.5,
        anchor="middle",
        muted=True,
    )
    return s.render()


# --------------------------------------------------------------------------- warps


def fig_store_warps() -> str:
    n = len(INDICES)
    blocks = -(-n // WARPS_PER_BLOCK)
    width, height = 940, 736
    s = Svg(
        "ch19-store-warps",
        width,
        height,
        "store.cu: a warp per token",
        f"How store.cu maps its work to threads, for {n} tokens whose slots are "
        f"indices = {INDICES}. A block has 128 threads, 4 warps of 32 lanes; the grid has "
        f"ceil({n} / 4) = {blocks} blocks. Warp number w = threadIdx.x / 32 + blockIdx.x * 4 "
        "copies token w: it reads slot = indices[w], then its 32 lanes copy row w of k (a "
        "strided view into the qkv output) to row slot of the key cache, then row w of v to "
        "row slot of the value cache. Block 0's warps 0 to 3 copy tokens 0 to 3 into slots 17, "
        "3, 40 and 8; block 1's warps 4 and 5 copy tokens 4 and 5 into slots 21 and 5, and its "
        "warps 6 and 7 have no token: warp_id >= length, they return. One warp's row of "
        "2 KiB (8 KV heads x 128 dims x 2 bytes, bfloat16) is 128 chunks of 16 bytes: lane l "
        "copies chunks l, l + 32, l + 64 and l + 96, so in each round the warp's 32 lanes "
        "touch 512 contiguous bytes. Below, the bug: with + blockIdx.x * 4 left out, block 1's "
        "warps compute w = 0 to 3 again and redo tokens 0 to 3, and tokens 4 and 5 are never "
        "stored; the CPU simulator shows it on every run.",
    )
    s.text(20, 28, "store.cu: a warp per token, its 32 lanes side by side", size=15, bold=True)
    s.text(
        20,
        50,
        f"{n} tokens; a block = 128 threads = 4 warps of 32 lanes; "
        f"grid = ceil({n} / 4) = {blocks} blocks",
        size=12.5,
        muted=True,
    )
    lx, x0 = 20, 156  # the rows' labels, the drawing's left edge
    span = width - 20 - x0
    bgap, pad = 24, 8  # the gap between the blocks' frames, a frame's padding
    frame_w = (span - bgap) / blocks
    wp = (frame_w - 2 * pad) / WARPS_PER_BLOCK  # a warp's pitch
    ww = wp - 5  # a warp's width

    def warp_x(w: int) -> float:
        b, i = divmod(w, WARPS_PER_BLOCK)
        return x0 + b * (frame_w + bgap) + pad + i * wp

    # ---- the tokens and their slots
    iy = 82
    s.text(lx, iy + 6, "token w", size=12.5, muted=True)
    s.text(lx, iy + 36, "indices[w]", size=13, mono=True)
    for w, slot in enumerate(INDICES):
        mid = warp_x(w) + ww / 2
        s.text(mid, iy + 6, str(w), size=12.5, anchor="middle", muted=True)
        s.box(mid - 26, iy + 16, 52, 30, CACHE, rx=5, fill_opacity=0.3, stroke_width=1.1)
        s.text(mid, iy + 36, str(slot), size=13.5, anchor="middle", mono=True, bold=True)

    # ---- the blocks and their warps
    wy, wh = 196, 50
    s.text(lx, wy + 16, "warp w", size=13.5, bold=True)
    _code(s, lx, wy + 34, ["w =", "threadIdx.x / 32", "+ blockIdx.x * 4"], muted=True)
    for b in range(blocks):
        fx = x0 + b * (frame_w + bgap)
        s.box(fx, wy - pad - 22, frame_w, wh + 2 * pad + 22, None, rx=10, dashed=True)
        s.text(fx + 10, wy - 13, f"block {b}", size=12.5, bold=True)
        s.text(
            fx + 10 + text_width(f"block {b}", 12.5, bold=True) + 14,
            wy - 13,
            f"blockIdx.x = {b}, threadIdx.x 0-127",
            size=12,
            muted=True,
        )
        for i in range(WARPS_PER_BLOCK):
            w = b * WARPS_PER_BLOCK + i
            x = warp_x(w)
            number = f"{i} + {b} * {WARPS_PER_BLOCK}"
            if w < n:
                s.box(x, wy, ww, wh, GPU, rx=6, fill_opacity=0.22, stroke_width=1.3)
                s.text(x + ww / 2, wy + 20, f"warp {w}", size=13.5, anchor="middle", bold=True)
                s.text(x + ww / 2, wy + 39, number, size=12, anchor="middle", mono=True, muted=True)
                # the token's slot, read by its warp
                s.arrow(x + ww / 2, iy + 49, x + ww / 2, wy - pad - 25, color=GREY, width=1.2)
            else:
                s.box(x, wy, ww, wh, None, rx=6, dashed=True, stroke_width=1)
                s.text(x + ww / 2, wy + 20, f"warp {w}", size=13.5, anchor="middle", muted=True)
                s.text(x + ww / 2, wy + 39, number, size=12, anchor="middle", mono=True, muted=True)
    s.text(
        x0 + span,
        wy + wh + pad + 18,
        f"warp_id >= length ({n}): return",
        size=12,
        anchor="end",
        mono=True,
        muted=True,
    )

    # ---- the caches: warp w writes row indices[w]
    ky, kh = 364, 26  # the key cache's cells
    vy = ky + kh + 26  # the value cache's
    sp = span / NUM_SLOTS  # a slot's pitch

    def slot_x(slot: int) -> float:
        return x0 + slot * sp

    written = set(INDICES)
    for y, name in ((ky, "k_cache"), (vy, "v_cache")):
        s.text(lx, y + 18, name, size=13, mono=True)
        for slot in range(NUM_SLOTS):
            if slot in written:
                s.box(slot_x(slot), y, sp - 2, kh, CACHE, rx=2, fill_opacity=0.55, stroke_width=1.2)
            else:
                s.box(slot_x(slot), y, sp - 2, kh, None, rx=2, stroke_width=0.6)
    for slot in written:
        s.text(slot_x(slot) + (sp - 2) / 2, ky + kh + 16, str(slot), size=12, anchor="middle")
    for w, slot in enumerate(INDICES):
        x1 = warp_x(w) + ww / 2
        x2 = slot_x(slot) + (sp - 2) / 2
        s.arrow(x1, wy + wh + 3, x2, ky - 3, color=GPU, width=1.4)
    s.text(x0, vy + kh + 18, "a cell: one slot's row", size=12, muted=True)
    s.text(
        x0 + span,
        vy + kh + 18,
        "then the value row: v[w] to the same row of v_cache",
        size=12,
        anchor="end",
        muted=True,
    )

    # ---- one warp, one row: 128 chunks of 16 bytes
    ry, rh = vy + kh + 86, 24  # the chunks' top, their height
    rgap = 10  # between the rounds
    rounds = CHUNKS // WARP_THREADS
    cp = (span - (rounds - 1) * rgap) / CHUNKS  # a chunk's pitch

    def chunk_x(i: int) -> float:
        return x0 + i * cp + (i // WARP_THREADS) * rgap

    s.text(lx, ry - 34, "one warp,", size=13.5, bold=True)
    s.text(lx, ry - 16, "one row", size=13.5, bold=True)
    s.text(lx, ry + 4, "lane l: chunks", size=12, muted=True)
    s.text(lx, ry + 20, "l, l + 32, …", size=12, muted=True)
    s.text(
        x0,
        ry - 38,
        "k[w] → k_cache[slot]: 8 KV heads × 128 dims × 2 bytes (bf16) = 2 KiB = 128 chunks of 16 B",
        size=12.5,
        muted=True,
    )
    for r in range(rounds):
        left = chunk_x(r * WARP_THREADS)
        right = chunk_x(r * WARP_THREADS + WARP_THREADS - 1) + cp - 1
        s.path(
            f"M{left},{ry - 4} L{left},{ry - 9} L{right},{ry - 9} L{right},{ry - 4}",
            color=GREY,
            width=1.1,
            arrow_end=False,
        )
        s.text(
            (left + right) / 2,
            ry - 14,
            f"round {r}: chunks {r * 32}-{r * 32 + 31}",
            size=12,
            anchor="middle",
        )
    for i in range(CHUNKS):
        lane = i % WARP_THREADS
        mine = lane == LANE
        s.box(
            chunk_x(i),
            ry,
            cp - 1,
            rh,
            RED if mine else GPU,
            rx=1,
            fill_opacity=0.6 if mine else 0.12 + 0.3 * lane / WARP_THREADS,
            stroke_width=0.8 if mine else 0,
        )
    for r in range(rounds):
        x = chunk_x(r * WARP_THREADS + LANE) + (cp - 1) / 2
        s.line(x, ry + rh + 2, x, ry + rh + 9, color=RED, width=1.2)
        s.text(x, ry + rh + 23, str(r * 32 + LANE), size=12, anchor="middle", color=RED)
    s.lines(
        x0,
        ry + rh + 46,
        [
            f"lane {LANE} (red) copies chunks "
            f"{', '.join(str(LANE + 32 * r) for r in range(rounds))}; in each round the warp's "
            "32 lanes touch 32 neighbouring chunks,",
            "512 contiguous bytes: one coalesced access. k[w] is row w of k, a strided view "
            "into the qkv output.",
        ],
        size=12.5,
        muted=True,
    )

    # ---- the bug: the warp number without + blockIdx.x * 4
    by = ry + rh + 92
    s.box(20, by, width - 40, height - 14 - by, RED, fill_opacity=0.05, dashed=True)
    s.text(36, by + 24, "The bug: without + blockIdx.x * 4", size=13.5, bold=True, color=RED)
    s.text(
        width - 36,
        by + 24,
        "w = threadIdx.x / 32 alone: what the CPU simulator shows, every run",
        size=12.5,
        anchor="end",
        muted=True,
    )
    cell, cpitch = 26, 30
    cy = by + 38

    def cells(x: float, labels: Sequence[str], color: str | None, dashed: bool = False) -> float:
        for j, label in enumerate(labels):
            s.box(x + j * cpitch, cy, cell, 24, color, rx=4, fill_opacity=0.3, dashed=dashed)
            s.text(x + j * cpitch + cell / 2, cy + 17, label, size=12.5, anchor="middle", mono=True)
        return x + len(labels) * cpitch

    x = 36.0
    warps = [str(i) for i in range(WARPS_PER_BLOCK)]
    for b in range(blocks):
        s.text(x, cy + 17, f"block {b}: w =", size=12.5, muted=True)
        x = cells(x + text_width(f"block {b}: w =", 12.5) + 16, warps, RED if b else GPU) + 24
    s.arrow(x - 10, cy + 12, x + 22, cy + 12, width=1.4)
    x += 34
    s.text(x, cy + 17, "tokens", size=12.5, muted=True)
    x += text_width("tokens", 12.5) + 16
    for t in range(n):
        stored = t < WARPS_PER_BLOCK
        cells(x + t * cpitch, [str(t)], CACHE if stored else RED, dashed=not stored)
    x += n * cpitch + 12
    s.text(x, cy + 8, "0-3 stored twice;", size=12.5, color=RED)
    s.text(x, cy + 24, "4, 5 never stored", size=12.5, bold=True, color=RED)
    return s.render()
