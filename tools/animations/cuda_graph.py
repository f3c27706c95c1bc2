"""CUDA graphs and their fixed buffers (chapter 18), recorded from real runs on the CPU.

Tiny Qwen3 answers the book's three prompts (3, 4 and 5 greedy tokens) with graphs of batch
sizes 1, 2 and 4, emulated on the CPU (``minisgl/utils/cpu_graph.py``). The recorder wraps
``GraphCaptureBuffer.set_batch`` and ``Graph.capture`` while the engine starts, then the
engine's ``forward_batch``, the buffer's ``copy_from``, the backend's ``prepare_for_replay``
and each graph's ``replay``, and after each event snapshots the real objects: the batch's
input ids, positions and KV slots (the dummy request's too), every row of the buffers, the top
token of each row of logits, the tokens sampled. Two more runs give the rest: an engine
without graphs, whose tokens the graphs must give, and one where ``copy_from`` is skipped at
one decode step, the mistake the emulation exists to show; on that engine, weights loaded
after the capture make the next replay raise the emulation's ``GraphContractError``. Each
engine's KV pool is zeroed after start-up, so that the slots the mistake leaves unwritten do
not hold what the previous engine left in the same memory (the frames would then change from
one recording to the next).
"""

from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
from unittest.mock import patch

from tools.animations import Animation
from tools.figures.svg import AMBER, BLUE, CYAN, GREEN, GREY, PURPLE, RED, TEAL, Svg, text_width

NAME = "cuda-graph"
SOURCES = [
    "tools/animations/cuda_graph.py",
    "tools/animations/__init__.py",
    "minisgl/engine/graph.py",
    "minisgl/engine/engine.py",
    "minisgl/utils/cpu_graph.py",
    "minisgl/utils/device.py",
    "minisgl/attention/native.py",
    "minisgl/scheduler/scheduler.py",
    "minisgl/llm/llm.py",
    "tools/parity.py",
]
MODEL = "tiny-qwen3"
SIZES = [1, 2, 4]  # three prompts: a decode batch of 3 runs the graph of 4
MAX_TOKENS = (3, 4, 5)  # per prompt, so that the decode batches shrink from 3 to 2 to 1
SKIPPED_STEP = 3  # the decode step whose copy_from the third run leaves out
COLOURS = [BLUE, TEAL, AMBER]  # one per request
WIDTH, HEIGHT = 940, 470
ROW_Y, ROW_STEP, ROW_H = 96, 32, 24  # the buffer's rows: first top, spacing, height
BATCH_X, BUF_X, CELL_W = (88, 164, 240), (398, 476, 554), (72, 72)
LOGITS_X, SAMPLED_X, GRAPH_X = 634, 742, (830, 860, 890)
TOKENS_Y = 282


# ------------------------------------------------------------------------------ snapshots
@dataclass(frozen=True)
class Buffers:
    """Every row of the GraphCaptureBuffer, as it was then."""

    input_ids: Tuple[int, ...]
    positions: Tuple[int, ...]
    out_loc: Tuple[int, ...]
    top: Tuple[Optional[int], ...]  # each row of logits: its top token; None: never written

    def column(self, i: int) -> Tuple[Any, ...]:
        return (self.input_ids, self.positions, self.out_loc)[i]


@dataclass
class Step:
    """One event: the buffers allocated, a graph captured, or a batch run."""

    kind: str  # "alloc", "capture", "prefill", "decode" (or "refused": a replay refused)
    before: Buffers
    after: Buffers
    number: int = 0  # the decode step, from 1
    labels: List[str] = field(default_factory=list)  # the batch's rows: r0 ... and "dummy"
    cells: List[Tuple[str, str, str]] = field(default_factory=list)  # input id, position, slot
    size: int = 0  # the real requests
    graph: int = 0  # the graph captured or replayed; 0: eager
    copied: Optional[Buffers] = None  # after copy_from (or after its skipped call)
    skipped: bool = False
    calls: List[str] = field(default_factory=list)
    sampled: List[int] = field(default_factory=list)  # one per real request, in batch order
    read: int = 0  # a capture: the tensors it read that it did not make
    weights: int = 0  # ... of them, the model's weights
    captured: Any = None  # a capture: the dev.Graph
    shapes: List[str] = field(default_factory=list)  # the buffers allocated: their shapes


@dataclass(frozen=True)
class Moved:
    """The model's weights after load_state_dict, against the graph of 1."""

    weights: int
    new: int  # at a new address
    held: int  # old ones that the graph holds (read at its capture)


def buffers(buffer, top_rows: int) -> Buffers:
    """A snapshot; rows of logits below top_rows have been written."""
    tops = buffer.logits[:top_rows].argmax(dim=-1).tolist()
    return Buffers(
        tuple(buffer.input_ids.tolist()),
        tuple(buffer.positions.tolist()),
        tuple(buffer.out_loc.tolist()),
        tuple(tops) + (None,) * (len(buffer.input_ids) - top_rows),
    )


def rows_text(n: int) -> str:
    return "row 0" if n == 1 else "rows 0 and 1" if n == 2 else f"rows 0 to {n - 1}"


def span(values: Sequence[int]) -> str:
    return str(values[0]) if len(values) == 1 else f"{values[0]}–{values[-1]}"


class Recording:
    """An engine's graph runner with its events recorded; `skip` leaves out that decode
    step's copy_from."""

    def __init__(self, skip: Optional[int] = None) -> None:
        self.skip = skip
        self.steps: List[Step] = []
        self.buffer: Any = None
        self.top_rows = 0  # rows of logits written so far
        self.capturing: Any = None  # the capture batch of the graph being captured
        self.step: Optional[Step] = None  # the batch being run
        self.decodes = 0

    def snap(self) -> Buffers:
        return buffers(self.buffer, self.top_rows)

    # ----------------------------------------------------------------- at start-up
    def set_batch(self, original: Callable) -> Callable:
        def set_batch(buffer, batch) -> None:
            if self.buffer is None:
                self.buffer = buffer
                shapes = [
                    f"{name}: {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                    for name, t in vars(buffer).items()
                ]
                self.steps.append(Step("alloc", self.snap(), self.snap(), shapes=shapes))
            original(buffer, batch)
            same = batch.input_ids.untyped_storage().data_ptr()
            assert same == buffer.input_ids.untyped_storage().data_ptr(), "not a view"
            self.capturing = batch

        return set_batch

    def capture(self, original: Callable) -> Callable:
        def capture(graph, step, stream, pool=None) -> None:
            before = self.snap()
            original(graph, step, stream, pool)
            bs = self.capturing.padded_size
            self.top_rows = max(self.top_rows, bs)
            ids = self.capturing.input_ids.tolist()
            rows = list(
                zip(ids, self.capturing.positions.tolist(), self.capturing.out_loc.tolist())
            )
            self.steps.append(
                Step(
                    "capture",
                    before,
                    self.snap(),
                    labels=["dummy"] * bs,
                    cells=[tuple(map(str, r)) for r in rows],  # type: ignore[misc]
                    graph=bs,
                    read=len(graph.emulated.storages),
                    captured=graph,
                )
            )

        return capture

    # ----------------------------------------------------------------- while serving
    def attach(self, engine) -> None:
        runner = engine.graph_runner
        weights = {t.untyped_storage().data_ptr() for t in engine.model.state_dict().values()}
        for step in self.steps:
            if step.captured is not None:
                step.weights = len(step.captured.emulated.storages & weights)
        forward_batch, copy_from = engine.forward_batch, self.buffer.copy_from
        prepare = engine.attn_backend.prepare_for_replay

        def recorded_forward(batch, args):
            rows = batch_rows(batch)
            graph = runner.can_use_cuda_graph(batch)
            if batch.is_decode:
                self.decodes += 1
            before = self.snap()
            self.step = Step(
                batch.phase,
                before,
                before,
                number=self.decodes if batch.is_decode else 0,
                labels=[f"r{r.uid}" if r.uid >= 0 else "dummy" for r in batch.padded_reqs],
                cells=rows,
                size=batch.size,
                graph=batch.padded_size if graph else 0,
            )
            output = forward_batch(batch, args)
            self.step.after = self.snap()
            self.step.sampled = output.next_tokens_cpu.tolist()
            self.steps.append(self.step)
            self.step = None
            return output

        def recorded_copy(batch) -> None:
            assert self.step is not None
            if self.step.number == self.skip:
                self.step.skipped = True
                self.step.calls.append("copy_from skipped")
            else:
                copy_from(batch)
                self.step.calls.append("buffer.copy_from(batch)")
            self.step.copied = self.snap()

        def recorded_prepare(batch) -> None:
            if self.step is not None:
                self.step.calls.append("prepare_for_replay(batch)")
            prepare(batch)

        def recorded_replay(bs: int, replay: Callable[[], None]) -> Callable[[], None]:
            def replay_graph() -> None:
                replay()
                if self.step is not None:
                    self.step.calls.append(f"graph_map[{bs}].replay()")

            return replay_graph

        engine.forward_batch = recorded_forward
        self.buffer.copy_from = recorded_copy
        engine.attn_backend.prepare_for_replay = recorded_prepare
        for bs, graph in runner.graph_map.items():
            graph.replay = recorded_replay(bs, graph.replay)

    def decode(self, number: int) -> Step:
        return next(s for s in self.steps if s.kind == "decode" and s.number == number)


def batch_rows(batch) -> List[Tuple[str, str, str]]:
    """Each row of the padded batch: its input ids, positions and KV slots (ranges when a row
    has several tokens, in a prefill)."""
    ids, pos, loc = batch.input_ids.tolist(), batch.positions.tolist(), batch.out_loc.tolist()
    rows, start = [], 0
    for req in batch.padded_reqs:
        end = start + req.extend_len
        n = end - start
        first = str(ids[start]) if n == 1 else f"{n} ids"
        rows.append((first, span(pos[start:end]), span(loc[start:end])))
        start = end
    assert start == len(ids)
    return rows


# -------------------------------------------------------------------------------- drawing
def row_y(i: int) -> float:
    return ROW_Y + i * ROW_STEP


def colour_of(label: str) -> str:
    return GREY if label == "dummy" else COLOURS[int(label[1:]) % len(COLOURS)]


def draw_batch(s: Svg, step: Step, heading: str) -> None:
    s.text(20, 60, heading, size=13, bold=True)
    for x, label in zip(BATCH_X, ("input_ids", "positions", "out_loc")):
        s.text(x, 86, label, size=12, muted=True, mono=True)
    for i, (label, cells) in enumerate(zip(step.labels, step.cells)):
        y = row_y(i)
        s.pill(20, y + ROW_H / 2, label, colour_of(label))
        for x, value in zip(BATCH_X, cells):
            s.box(x - 4, y, CELL_W[0] - 4, ROW_H, colour_of(label), rx=4, fill_opacity=0.12)
            s.text(x, y + 17, value, size=13, mono=True)


def draw_links(s: Svg, step: Step) -> None:
    """What connects the batch to the buffer's rows: views (a capture), a copy, none."""
    rows = len(step.labels)
    if step.kind == "capture":
        label, dashed, colour = "views", True, PURPLE
    elif step.kind == "decode" and step.copied is not None:
        label, dashed, colour = (
            ("skipped", True, RED) if step.skipped else ("copy_from", False, None)
        )
    else:
        return
    s.text(341, 86, label, size=12, anchor="middle", mono=True, color=colour)
    for i in range(rows):
        y = row_y(i) + ROW_H / 2
        if step.skipped:
            s.line(314, y, 370, y, color=RED, dashed=True, width=1.4)
            s.text(341, y + 4.5, "✕", size=13, anchor="middle", color=RED, bold=True)
        else:
            draw = s.line if dashed else s.arrow
            draw(314, y, 370, y, color=colour, dashed=dashed, width=1.4)


def draw_buffers(
    s: Svg,
    shown: Buffers,
    previous: Buffers,
    reading: int,
    wrong: Sequence[Sequence[bool]] = (),
) -> None:
    """The buffer's rows; `reading` rows are read by the graph of this frame (the others are
    drawn faint); cells that changed since `previous` are bold; `wrong` marks stale cells."""
    rows = len(shown.input_ids)
    s.text(376, 60, f"GraphCaptureBuffer: one for every graph, {rows} rows", size=13, bold=True)
    labels = ("input_ids", "positions", "out_loc")
    for x, label in zip(BUF_X, labels):
        s.text(x, 86, label, size=12, muted=True, mono=True)
    s.text(LOGITS_X, 86, "logits: top", size=12, muted=True, mono=True)
    for i in range(rows):
        y, read = row_y(i), i < reading
        s.text(384, y + 17, str(i), size=13, anchor="middle", muted=not read)
        for c, x in enumerate(BUF_X):
            value, old = shown.column(c)[i], previous.column(c)[i]
            stale = bool(wrong) and wrong[i][c]
            changed = value != old
            s.box(
                x - 4,
                y,
                CELL_W[1] - 4,
                ROW_H,
                RED if stale else CYAN,
                rx=4,
                fill_opacity=0.4 if changed or stale else 0.14 if read else 0.05,
                stroke_width=1.8 if changed or stale else 0.8,
            )
            s.text(x, y + 17, str(value), size=13, mono=True, bold=changed, muted=not read)
        top, old_top = shown.top[i], previous.top[i]
        changed = top is not None and top != old_top
        s.box(
            LOGITS_X - 4,
            y,
            96,
            ROW_H,
            CYAN,
            rx=4,
            fill_opacity=0.4 if changed else 0.14 if read else 0.05,
            stroke_width=1.8 if changed else 0.8,
        )
        text = "empty" if top is None else str(top)
        s.text(LOGITS_X, y + 17, text, size=13, mono=top is not None, bold=changed, muted=not read)


def draw_sampled(s: Svg, step: Step, right: Sequence[int] = ()) -> None:
    s.text(SAMPLED_X, 86, "sampled", size=12, muted=True, mono=True)
    for i in range(len(step.labels)):
        y = row_y(i)
        if i >= step.size:
            s.text(SAMPLED_X, y + 17, "not read", size=12, muted=True)
            continue
        token = step.sampled[i]
        bad = bool(right) and right[i] != token
        s.box(SAMPLED_X - 4, y, 68, ROW_H, RED if bad else GREEN, rx=4, fill_opacity=0.3)
        s.text(SAMPLED_X, y + 17, str(token), size=13, mono=True, bold=True)


def draw_graphs(s: Svg, captured: Sequence[int], active: int, word: str) -> None:
    s.text(GRAPH_X[0] - 6, 60, "graph_map", size=13, bold=True, mono=True)
    for x, bs in zip(GRAPH_X, sorted(SIZES, reverse=True)):
        s.text(x + 11, 86, str(bs), size=13, anchor="middle", bold=bs == active)
        h = row_y(bs - 1) + ROW_H - ROW_Y
        if bs not in captured:
            s.box(x, ROW_Y, 22, h, None, rx=5, dashed=True, stroke_width=1)
            continue
        on = bs == active
        s.box(
            x,
            ROW_Y,
            22,
            h,
            PURPLE,
            rx=5,
            fill_opacity=0.5 if on else 0.15,
            stroke_width=2.4 if on else 1,
        )
    if active:
        colour = RED if word == "refused" else None
        s.text(GRAPH_X[-1] + 22, row_y(3) + ROW_H + 18, word, size=12, anchor="end", bold=True,
               color=colour)  # fmt: skip


def draw_tokens(
    s: Svg, made: Dict[str, List[int]], new: Dict[str, int], right: Dict[str, List[int]]
) -> None:
    """Each request's tokens so far; those of this step outlined; those that differ from the
    right run's in red, with the right one under them."""
    s.text(20, TOKENS_Y, "tokens made so far (the first by the prefill, one per decode step)",
           size=12, muted=True)  # fmt: skip
    for row, (label, tokens) in enumerate(made.items()):
        y = TOKENS_Y + 14 + row * 46
        s.pill(20, y + 11, label, colour_of(label))
        x = 70.0
        for k, token in enumerate(tokens):
            good = right.get(label)
            bad = good is not None and k < len(good) and good[k] != token
            fresh = k == len(tokens) - 1 and label in new
            w = text_width(str(token), 13, mono=True) + 14
            s.box(
                x,
                y,
                w,
                22,
                RED if bad else GREEN,
                rx=4,
                fill_opacity=0.45 if fresh else 0.18,
                stroke_width=2 if fresh else 0.8,
            )
            s.text(x + 7, y + 16, str(token), size=13, mono=True, bold=fresh)
            step = w
            if bad and good is not None:
                note = f"not {good[k]}"
                s.text(x, y + 36, note, size=12, color=RED)
                step = max(w, text_width(note, 12))
            x += step + 8


def draw_legend(s: Svg) -> None:
    x, y = 20.0, HEIGHT - 12
    for colour, opacity, label in [
        (CYAN, 0.14, "a buffer row"),
        (CYAN, 0.4, "written by this step"),
        (GREY, 0.3, "the dummy request"),
        (PURPLE, 0.5, "the graph that runs"),
        (GREEN, 0.3, "a sampled token"),
        (RED, 0.4, "stale or wrong"),
    ]:
        s.box(x, y - 11, 14, 14, colour, rx=3, fill_opacity=opacity, stroke_width=1)
        s.text(x + 20, y, label, size=12, muted=True)
        x += 40 + text_width(label, 12)


@dataclass
class Picture:
    """What one picture shows, besides its narration."""

    title: str
    step: Step
    shown: Buffers
    previous: Buffers
    captured: List[int]
    batch_heading: str = "the batch"
    links: bool = True
    sampled: bool = False
    reading: int = 0
    made: Dict[str, List[int]] = field(default_factory=dict)
    new: Dict[str, int] = field(default_factory=dict)
    right: Dict[str, List[int]] = field(default_factory=dict)
    right_sampled: Sequence[int] = ()
    wrong: Sequence[Sequence[bool]] = ()
    calls: str = ""
    message: List[str] = field(default_factory=list)
    notes: Tuple[str, List[str]] = ("", [])  # a heading and lines, where the tokens go
    aside: Tuple[str, List[str]] = ("", [])  # a heading and lines, where the batch goes


def draw(f: Picture) -> str:
    s = Svg("anim-cuda-graph", WIDTH, HEIGHT, "CUDA graph capture and replay", f.title)
    s.text(20, 28, f.title, size=15, bold=True)
    if f.step.labels:
        draw_batch(s, f.step, f.batch_heading)
    if f.links:
        draw_links(s, f.step)
    draw_buffers(s, f.shown, f.previous, f.reading, f.wrong)
    if f.sampled:
        draw_sampled(s, f.step, f.right_sampled)
    word = {"decode": "replays", "capture": "captured", "refused": "refused"}.get(f.step.kind, "")
    draw_graphs(s, f.captured, f.step.graph if word else 0, word)
    if f.aside[1]:
        s.text(20, 60, f.aside[0], size=13, bold=True)
        s.lines(20, 92, f.aside[1], size=13, gap=1.5)
    if f.calls:
        s.text(20, 250, f.calls, size=13, mono=True)
    if f.message:
        s.text(20, TOKENS_Y, "GraphContractError:", size=13, bold=True, color=RED)
        s.lines(20, TOKENS_Y + 24, f.message, size=13, gap=1.45, mono=True)
    elif f.notes[1]:
        s.text(20, TOKENS_Y, f.notes[0], size=12, muted=True)
        s.lines(20, TOKENS_Y + 24, f.notes[1], size=13, gap=1.6, mono=True)
    elif f.made:
        draw_tokens(s, f.made, f.new, f.right)
    draw_legend(s)
    return s.render()


# ------------------------------------------------------------------------------- the story
def listed(items: Sequence[object]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def reqs(step: Step) -> List[str]:
    return step.labels[: step.size]


class Story:
    """The frames, from the recorded runs: `good` with graphs, `eager` without (its tokens per
    request), `bad` with one copy_from left out, and the error of a replay after new weights."""

    def __init__(
        self,
        good: Recording,
        eager: Dict[str, List[int]],
        bad: Recording,
        error: str,
        moved: Moved,
    ) -> None:
        self.good, self.eager, self.bad, self.error, self.moved = good, eager, bad, error, moved
        self.animation = Animation(NAME, "CUDA graphs: capture, padding, replay, stale buffers")
        self.animation.seconds_per_frame = 7.0

    def add(self, frame: Picture, narration: str) -> None:
        self.animation.add(draw(frame), narration)

    def made(self, run: Recording, upto: Step) -> Tuple[Dict[str, List[int]], Dict[str, int]]:
        """Each request's tokens up to the step `upto`, and those `upto` made."""
        made: Dict[str, List[int]] = {}
        for step in run.steps:
            for label, token in zip(reqs(step), step.sampled):
                made.setdefault(label, []).append(token)
            if step is upto:
                return made, dict(zip(reqs(step), step.sampled))
        raise AssertionError("not a step of the run")

    def finished(self, step: Step) -> List[str]:
        """The requests whose last token this step made (as many as the right run has)."""
        made, _ = self.made(self.good, step)
        return [r for r in reqs(step) if len(made[r]) == len(self.eager[r])]

    def capture_frames(self) -> None:
        steps = self.good.steps
        alloc, captures = steps[0], [s for s in steps if s.kind == "capture"]
        rows = len(alloc.before.input_ids)
        self.add(
            Picture(
                "start-up: the buffers",
                alloc,
                alloc.after,
                alloc.after,
                [],
                links=False,
                notes=("GraphCaptureBuffer.init: the fields and their shapes", alloc.shapes),
            ),
            f"Start-up: the engine is asked for graphs of batch sizes {listed(SIZES)}. "
            f"GraphRunner allocates one GraphCaptureBuffer of {rows} rows, the largest graph's "
            f"size: input_ids, positions and out_loc, all {rows} zeros, and {rows} rows of "
            f"logits, not written yet.",
        )
        done: List[int] = []
        for k, step in enumerate(captures):
            done.append(step.graph)
            rows_used = rows_text(step.graph)
            if k == 0:
                said = (
                    f"Capture, the largest first: a batch of {step.graph} dummy requests takes "
                    f"its inputs from {rows_used} (set_batch makes them views of the buffers). "
                    f"The step runs once eagerly, then is captured, writing {rows_used} of the "
                    f"logits. The capture read {step.read} tensors it did not make "
                    f"({step.weights} of them weights); the emulation keeps them, and a replay "
                    f"may read no other."
                )
            else:
                said = (
                    f"The graph of {step.graph}: {step.graph} dummy "
                    f"request{'s' * (step.graph > 1)} on {rows_used} of the same buffers, "
                    f"captured the same way (it read {step.read} tensors it did not make)."
                )
            if k == len(captures) - 1:
                said += (
                    f" graph_map now holds {listed(sorted(done))}: {len(done)} graphs, one set "
                    f"of buffers."
                )
            self.add(
                Picture(
                    f"capture: the graph of {step.graph}",
                    step,
                    step.after,
                    step.before,
                    list(done),
                    batch_heading=f"capture batch ({step.graph} × dummy)",
                    reading=step.graph,
                    calls="_capture_graphs: set_batch(batch) · step() · graph.capture(step)",
                    notes=(
                        "captured so far (GraphRunner.graph_map)",
                        [
                            f"graph_map[{c.graph}]: {rows_text(c.graph)} of the buffers; it read "
                            f"{c.read} tensors it did not make, {c.weights} of them weights"
                            for c in captures[: k + 1]
                        ],
                    ),
                ),
                said,
            )

    def prefill_frame(self) -> None:
        step = next(s for s in self.good.steps if s.kind == "prefill")
        made, new = self.made(self.good, step)
        sizes = [int(c[0].split()[0]) for c in step.cells]
        self.add(
            Picture(
                "prefill: eager",
                step,
                step.after,
                step.before,
                SIZES,
                batch_heading="the prefill batch",
                made=made,
                new=new,
                calls="can_use_cuda_graph(batch) is False: model.forward(), eagerly",
            ),
            f"{listed(reqs(step))} arrive with prompts of {listed(sizes)} tokens. Their prefill "
            f"batch has {sum(sizes)} tokens, a shape no graph has: can_use_cuda_graph is False, "
            f"the model runs eagerly, and the buffers are untouched. It samples "
            f"{listed(step.sampled)}.",
        )

    def decode_frames(self) -> None:
        steps = [s for s in self.good.steps if s.kind == "decode"]
        first = steps[0]
        made, new = self.made(self.good, first)
        before = {k: v[:-1] if k in new else v for k, v in made.items()}
        assert first.copied is not None
        pad = len(first.labels) - first.size
        dummy = first.cells[-1] if pad else None
        base = Picture(
            "", first, first.before, first.before, SIZES, "the batch, padded", reading=first.graph
        )
        self.add(
            replace(
                base,
                title=f"decode step 1: pad_batch to {first.graph}",
                links=False,
                made=before,
                calls=f"Scheduler._prepare_batch: pad_batch(batch), padded_size {first.graph}",
            ),
            f"Decode step 1: {listed(reqs(first))}, a batch of {first.size}. pad_batch adds "
            f"the dummy request up to {first.graph}, the smallest captured size that holds it"
            + (
                f": token {dummy[0]} at position {dummy[1]}, its K/V to slot {dummy[2]}, the "
                f"spare page. The buffers still hold the capture's values."
                if dummy
                else "."
            ),
        )
        columns = list(zip(*first.cells))
        self.add(
            replace(
                base,
                title="decode step 1: copy_from",
                shown=first.copied,
                made=before,
                calls="GraphRunner.replay: " + first.calls[0],
            ),
            f"GraphRunner.replay first copies the batch into {rows_text(first.graph)} "
            f"(copy_from): input ids {listed(columns[0])}; positions {listed(columns[1])}; KV "
            f"slots {listed(columns[2])}.",
        )
        self.add(
            replace(
                base,
                title=f"decode step 1: the graph of {first.graph} replays",
                shown=first.after,
                previous=first.copied,
                sampled=True,
                made=made,
                new=new,
                calls="GraphRunner.replay: " + " · ".join(first.calls),
            ),
            f"Then prepare_for_replay refreshes the attention metadata and "
            f"graph_map[{first.graph}].replay() runs the whole step, writing "
            f"{first.graph} rows of logits. Only {rows_text(first.size)} are read: sampled "
            f"{listed(first.sampled)}"
            + (
                f"; row {first.size}'s top token, {first.after.top[first.size]}, is never sampled."
                if pad
                else "."
            ),
        )
        for step in steps[1:]:
            self.decode_frame(step)
        eager = [t for r in sorted(self.eager) for t in self.eager[r]]
        graphs = [t for r in sorted(self.eager) for t in self.made(self.good, steps[-1])[0][r]]
        same = sum(a == b for a, b in zip(graphs, eager))
        counts: Dict[int, int] = {}
        for step in steps:
            counts[step.graph] = counts.get(step.graph, 0) + 1
        times = {1: "once", 2: "twice"}
        replays = listed([f"of {bs} {times.get(n, f'{n} times')}" for bs, n in counts.items()])
        last = steps[-1]
        self.add(
            Picture(
                "the run: every decode step a replay",
                last,
                last.after,
                last.after,
                SIZES,
                batch_heading="the last batch",
                links=False,
                sampled=True,
                reading=last.graph,
                made=self.made(self.good, last)[0],
            ),
            f"All {len(steps)} decode steps were replays: the graph {replays}. An engine "
            f"without graphs, on the same prompts, "
            + (
                f"gives the same tokens: {same} of {len(eager)} equal."
                if same == len(eager)
                else f"gives other tokens: only {same} of {len(eager)} equal."
            ),
        )

    def decode_frame(self, step: Step) -> None:
        made, new = self.made(self.good, step)
        columns = list(zip(*step.cells))
        pad = len(step.labels) - step.size
        said = f"Decode step {step.number}: {listed(reqs(step))}"
        said += (
            f", padded to {step.graph} again"
            if pad
            else f" {'fill' if step.size > 1 else 'fills'} the graph of {step.graph}"
        )
        ids, at = ("input ids", "positions") if step.size > 1 else ("input id", "position")
        said += f". copy_from writes {ids} {listed(columns[0])} and {at} {listed(columns[1])}"
        untouched = [i for i in range(step.graph, len(step.after.input_ids))]
        if untouched:
            said += (
                f"; rows {listed(untouched)} keep older values, which the graph of "
                f"{step.graph} never reads"
            )
        said += f". Sampled: {listed(step.sampled)}"
        done = self.finished(step)
        if done:
            said += f"; {listed(done)} {'has' if len(done) == 1 else 'have'} all its tokens"
        self.add(
            Picture(
                f"decode step {step.number}: the graph of {step.graph}",
                step,
                step.after,
                step.before,
                SIZES,
                batch_heading="the batch" + (", padded" if pad else ""),
                sampled=True,
                reading=step.graph,
                made=made,
                new=new,
                calls="GraphRunner.replay: " + " · ".join(step.calls),
            ),
            said + ".",
        )

    def bug_frames(self) -> None:
        step = self.bad.decode(SKIPPED_STEP)
        right = self.good.decode(SKIPPED_STEP)
        assert step.skipped and step.copied is not None
        n = len(step.labels)
        wrong = [
            [step.copied.column(c)[i] != int(step.cells[i][c]) for c in range(3)]
            if i < n
            else [False] * 3
            for i in range(len(step.after.input_ids))
        ]
        made, new = self.made(self.bad, step)
        before_made = {k: v[:-1] if k in new else v for k, v in made.items()}
        columns = list(zip(*step.cells))
        previous = self.bad.decode(SKIPPED_STEP - 1)
        stale = [f"{i} at {p}" for i, p in zip(step.copied.input_ids[:n], step.copied.positions)]
        theirs = ""
        if all(
            step.copied.column(c)[i] == int(previous.cells[i][c]) for i in range(n) for c in (0, 1)
        ):
            theirs = f", the inputs of {listed(previous.labels[:n])} then"
        self.add(
            Picture(
                f"mistake: copy_from skipped at decode step {SKIPPED_STEP}",
                step,
                step.copied,
                step.before,
                SIZES,
                batch_heading="the batch" + (", padded" if n > step.size else ""),
                reading=step.graph,
                wrong=wrong,
                made=before_made,
                calls="GraphRunner.replay: " + step.calls[0],
            ),
            f"The same run again, with copy_from left out at decode step {SKIPPED_STEP}, a "
            f"mistake on purpose. {listed(reqs(step))} bring input ids {listed(columns[0])} at "
            f"positions {listed(columns[1])}, but {rows_text(n)} still hold step "
            f"{SKIPPED_STEP - 1}'s values: {listed(stale)}{theirs}.",
        )
        differ = [(a, b) for a, b in zip(step.sampled, right.sampled) if a != b]
        self.add(
            Picture(
                f"mistake: the graph of {step.graph} replays on stale rows",
                step,
                step.after,
                step.copied,
                SIZES,
                batch_heading="the batch" + (", padded" if n > step.size else ""),
                sampled=True,
                reading=step.graph,
                wrong=wrong,
                made=made,
                new=new,
                right=self.made(self.good, right)[0],
                right_sampled=right.sampled,
                calls="GraphRunner.replay: " + " · ".join(step.calls),
            ),
            f"prepare_for_replay still refreshes the attention metadata of "
            f"{listed(reqs(step))}, and the graph of "
            f"{step.graph} replays on the stale rows: it samples {listed(step.sampled)} where "
            f"the right run sampled {listed(right.sampled)} ({len(differ)} of {step.size} "
            f"differ). Nothing fails: on a GPU, only the tokens would tell.",
        )
        last = [s for s in self.bad.steps if s.kind == "decode"][-1]
        made_bad = self.made(self.bad, last)[0]
        total = sum(len(v) for v in self.eager.values())
        wrong_tokens = sum(
            a != b for r in self.eager for a, b in zip(made_bad.get(r, []), self.eager[r])
        )
        slots = [
            str(step.copied.out_loc[i])
            for i in range(step.size)
            if step.copied.out_loc[i] != int(step.cells[i][2])
        ]
        lost = [step.cells[i][2] for i in range(step.size)]
        self.add(
            Picture(
                "mistake: the end of the run",
                last,
                last.after,
                last.after,
                SIZES,
                batch_heading="the last batch",
                links=False,
                sampled=True,
                reading=last.graph,
                made=made_bad,
                right=self.eager,
            ),
            f"And it lasts: step {SKIPPED_STEP} wrote its keys and values to slots "
            f"{listed(slots)} (step {SKIPPED_STEP - 1}'s) instead of {listed(lost)}, which "
            f"stay unwritten, so the later steps attend to wrong keys. {wrong_tokens} of "
            f"{total} tokens {'differs' if wrong_tokens == 1 else 'differ'} from the eager "
            f"engine's.",
        )

    def error_frame(self) -> None:
        last = [s for s in self.bad.steps if s.kind == "decode"][-1]
        text = self.error
        lines = textwrap.wrap(text, 108)
        what = text.split(";")[0].split(" reads ", 1)[-1]  # a (...) tensor that the capture ...
        m = self.moved
        self.add(
            Picture(
                "new weights after the capture: refused",
                Step("refused", last.after, last.after, graph=1),
                last.after,
                last.after,
                SIZES,
                links=False,
                message=lines,
                calls="model.load_state_dict(new tensors) · graph_map[1].replay()",
                aside=(
                    "the model after load_state_dict",
                    [
                        f"{m.new} of its {m.weights} weight tensors",
                        "are new, at new addresses;",
                        f"the graph of 1 holds {m.held} old ones,",
                        "read at its capture",
                    ],
                ),
            ),
            "A mistake the emulation refuses: load_state_dict puts new weight tensors in the "
            "model after the capture. A real graph would go on reading the old ones; at the "
            f"next replay the emulation raises GraphContractError: the replay reads {what}.",
        )


# ------------------------------------------------------------------------------ the runs
def make_llm(recording: Optional[Recording]):
    import torch

    from minisgl.engine.graph import GraphCaptureBuffer
    from minisgl.llm import LLM
    from minisgl.utils import device as dev
    from tools.models import ensure_model

    settings: Dict[str, Any] = dict(cuda_graph_bs=SIZES) if recording else dict(cuda_graph_max_bs=0)
    path = str(ensure_model(MODEL))
    make = lambda: LLM(
        path,
        dtype=torch.float32,
        attention_backend="torch",
        page_size=4,
        num_page_override=64,
        max_running_req=4,
        **settings,
    )
    if recording is None:
        llm = make()
        clear_pool(llm)
        return llm
    set_batch, capture = GraphCaptureBuffer.set_batch, dev.Graph.capture
    GraphCaptureBuffer.set_batch = recording.set_batch(set_batch)  # type: ignore[method-assign]
    dev.Graph.capture = recording.capture(capture)  # type: ignore[method-assign]
    try:
        llm = make()
    finally:
        GraphCaptureBuffer.set_batch = set_batch  # type: ignore[method-assign]
        dev.Graph.capture = capture  # type: ignore[method-assign]
    clear_pool(llm)
    recording.attach(llm.engine)
    return llm


def clear_pool(llm) -> None:
    """Zero the KV pool, which starts as whatever memory it was given (torch.empty): the slots
    a mistake leaves unwritten then hold zeros, not what an earlier engine left there."""
    pool = llm.engine.kv_cache
    for layer in range(pool.num_layers):
        pool.k_cache(layer).zero_()
        pool.v_cache(layer).zero_()


def generate(llm) -> Dict[str, List[int]]:
    from minisgl.core import SamplingParams
    from tools.parity import build_prompts

    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    outputs = llm.generate(build_prompts(MODEL), params)
    return {f"r{i}": list(o["token_ids"]) for i, o in enumerate(outputs)}


def record() -> Animation:
    """The engine runs on the CPU even where there is a GPU: the frames show the emulation."""
    with patch.dict(os.environ, {"MINISGL_DEVICE": "cpu"}):
        return record_on_cpu()


def record_on_cpu() -> Animation:
    from minisgl.utils.cpu_graph import GraphContractError

    good, bad = Recording(), Recording(skip=SKIPPED_STEP)
    with make_llm(good) as llm:
        generate(llm)
    with make_llm(None) as llm:
        eager = generate(llm)
    error = ""
    with make_llm(bad) as llm:
        generate(llm)
        model, graph = llm.engine.model, llm.engine.graph_runner.graph_map[1]
        old = [t.untyped_storage().data_ptr() for t in model.state_dict().values()]
        model.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
        new = [t.untyped_storage().data_ptr() for t in model.state_dict().values()]
        held = graph.emulated.storages
        moved = Moved(len(old), sum(a != b for a, b in zip(old, new)), len(held & set(old)))
        try:
            graph.replay()
        except GraphContractError as e:
            error = str(e)
    assert error, "the replay after new weights was not refused"
    story = Story(good, eager, bad, error, moved)
    story.capture_frames()
    story.prefill_frame()
    story.decode_frames()
    story.bug_frames()
    story.error_frame()
    return story.animation
