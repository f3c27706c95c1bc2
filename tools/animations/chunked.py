"""Chunked prefill (chapter 10), recorded from a real run of the scheduler.

Two short requests decode when a long prompt arrives at a scheduler whose prefill batches
may compute at most 20 prompt tokens (``max_extend_tokens``), and a short request arrives
while the long one is being cut. The book's scripted scheduler (``examples/helpers/scripted.py``)
drives the real scheduler on the tiny Qwen3 model, with chapter 10's plain loop. The recorder
snapshots each step: what ran (every request's positions in the batch, its token ids, and
whether it was a ``ChunkedReq``), the waiting list, each ``PrefillAdder.try_add_one`` that
said no and the budget it had left, and the tokens every request has made. Each frame draws
one step, with the steps so far as bars as tall as the tokens they computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from tools.animations import Animation
from tools.figures.svg import BLUE, CYAN, GREEN, GREY, ORANGE, PURPLE, TEAL, Svg

NAME = "chunked-prefill"
SOURCES = [
    "tools/animations/chunked.py",
    "tools/animations/__init__.py",
    "examples/helpers/scripted.py",
    "minisgl/scheduler/scheduler.py",
    "minisgl/scheduler/prefill.py",
]
MODEL = "tiny-qwen3"
BUDGET = 20  # max_extend_tokens: the most prompt tokens one prefill batch computes
LONG = (
    "The lighthouse keeper climbed the hundred steps of the tower every evening to light the "
    "lamp. One night a storm broke the great lens, and the ships out at sea could no longer "
    "see the rocks. He gathered every lantern in the village, set them in a ring around the "
    "broken glass, and kept them burning until dawn. What did the keeper use instead of the lens?"
)
REQUESTS = [  # (arrival step, prompt, max_tokens)
    (0, "The capital of France is", 12),
    (0, "Water boils at", 10),
    (2, LONG, 4),
    (5, "The sky is", 5),
]
LONG_UID = 2
OWNER_COLOURS = [BLUE, TEAL, ORANGE, PURPLE]
WIDTH, HEIGHT = 940, 456


@dataclass(frozen=True)
class Piece:
    """One request's part of a batch: the positions it computed, and their token ids."""

    uid: int
    start: int  # cached_len before the step
    end: int  # device_len: the batch computed positions start .. end-1
    chunked: bool  # a ChunkedReq: part of a prompt, samples nothing
    ids: Tuple[int, ...]

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class StepView:
    step: int
    phase: str
    pieces: List[Piece]
    arrived: List[int]
    refused: List[Tuple[int, int]]  # (uid, budget left) for each try_add_one that said no
    waiting: List[int]  # the waiting list after the step
    made: Dict[int, int]  # uid -> tokens made so far
    finished: List[int]  # uids whose last token came in this step

    def tokens(self) -> int:
        return sum(p.size for p in self.pieces)

    def piece(self, uid: int) -> Optional[Piece]:
        return next((p for p in self.pieces if p.uid == uid), None)


def names(uids: Iterable[int]) -> str:
    out = [f"r{u}" for u in uids]
    return out[0] if len(out) == 1 else ", ".join(out[:-1]) + " and " + out[-1]


class Run:
    """All the steps of the run: a frame's labels need the whole (piece k of n, the bars)."""

    def __init__(self, views: List[StepView], sizes: Dict[int, Tuple[int, int]]) -> None:
        self.views = views
        self.sizes = sizes  # uid -> (prompt tokens, max_tokens)
        self.long_steps = [
            v.step for v in views if v.phase == "prefill" and v.piece(LONG_UID) is not None
        ]

    def piece_label(self, step: int) -> str:
        return f"piece {self.long_steps.index(step) + 1} of {len(self.long_steps)}"

    def upto(self, view: StepView) -> List[StepView]:
        return self.views[: self.views.index(view) + 1]

    def state(self, uid: int, view: StepView) -> str:
        """What a request not in this step's batch is doing."""
        if any(uid in v.finished for v in self.upto(view)):
            return f"done: {view.made[uid]} tokens made"
        if uid in view.waiting:
            left = dict(view.refused).get(uid)
            if left is not None:
                return f"waiting: not admitted, {left} tokens of budget left"
            if view.waiting[0] != uid:
                return f"waiting, behind r{view.waiting[0]}"
            return "waiting for its next piece"
        return "running, sits this step out"


def narrate(run: Run, view: StepView) -> str:
    long, others = view.piece(LONG_UID), [p for p in view.pieces if p.uid != LONG_UID]
    said = f"Step {view.step}: "
    if view.phase == "decode":
        i = run.views.index(view)
        each = "a token" if len(view.pieces) == 1 else "a token each"
        who = names(p.uid for p in view.pieces)
        if i > 0 and any(p.chunked for p in run.views[i - 1].pieces):
            verb = "decodes" if len(view.pieces) == 1 else "decode"
            said += f"a chunk ran in the last step, so now {who} {verb} {each}"
        else:
            said += f"a decode step gives {who} {each}"
    elif long is not None:
        if LONG_UID in view.arrived:
            said += f"r{LONG_UID} arrives with {run.sizes[LONG_UID][0]} prompt tokens, and its "
        else:
            said += f"r{LONG_UID}'s "
        said += f"{run.piece_label(view.step)} computes tokens {long.start} to {long.end - 1}"
        if long.chunked:
            whole = long.size == BUDGET
            said += f", {'the whole' if whole else 'what is left of the'} budget of {BUDGET}"
            said += f"; r{LONG_UID} stays first in line"
        else:
            said += " and samples its first token"
        if others:
            said += (
                f"; {names(o.uid for o in others)}'s {sum(o.size for o in others)} prompt "
                f"tokens fill the batch to {view.tokens()} of {BUDGET}"
            )
    else:
        one = len(view.pieces) == 1
        said += (
            f"{names(p.uid for p in view.pieces)} {'is' if one else 'are'} prefilled whole, "
            f"{view.tokens()} prompt tokens of a budget of {BUDGET}"
        )
    events = [f"r{uid} is not admitted: {left} tokens of budget left" for uid, left in view.refused]
    admitted = {p.uid for p in view.pieces} | {uid for uid, _ in view.refused}
    behind = [u for u in view.arrived if u in view.waiting and u not in admitted]
    if behind:
        events.append(f"{names(behind)} arrives and waits behind r{view.waiting[0]}")
    if view.finished:
        events.append(f"{names(view.finished)} {'is' if len(view.finished) == 1 else 'are'} done")
    return said + "." + (" " + "; ".join(events) + "." if events else "")


def short(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit // 2 - 2] + " … " + text[-limit // 2 + 2 :]


def draw_prompt(s: Svg, run: Run, view: StepView, decode: Callable[[List[int]], str]) -> None:
    """The long prompt, a cell per token: in the pool, computed in this step, still to come."""
    prompt_len, upto = run.sizes[LONG_UID][0], run.upto(view)
    long_pieces = [v.piece(LONG_UID) for v in upto if v.phase == "prefill"]
    pieces = [p for p in long_pieces if p is not None]
    now = view.piece(LONG_UID) if view.phase == "prefill" else None
    done = max([p.end for p in pieces if p is not now] + [0])
    label = f"r{LONG_UID}'s prompt: {prompt_len} tokens"
    if not any(LONG_UID in v.arrived for v in upto):
        label += f" (it arrives at step {REQUESTS[LONG_UID][0]})"
    s.text(20, 54, label, size=13, bold=True)
    w = (WIDTH - 40) / prompt_len
    for i in range(prompt_len):
        if now is not None and now.start <= i < now.end:
            colour, opacity = ORANGE, 0.65
        elif i < done:
            colour, opacity = CYAN, 0.35
        else:
            colour, opacity = GREY, 0.12
        s.box(20 + i * w, 62, w - 1.5, 18, colour, rx=1.5, fill_opacity=opacity, stroke_width=0.6)
    for t in sorted({p.start for p in pieces} | {p.end for p in pieces} | {0, prompt_len}):
        x = 20 + t * w - 0.75
        s.line(x, 58, x, 84, opacity=0.7)
        s.text(x, 98, str(t), size=12, anchor="middle", muted=True)
    if now is not None:
        s.text(20, 120, f"this step: “{short(decode(list(now.ids)), 124)}”", size=13, italic=True)
    elif 0 < done < prompt_len:
        waiting = f"tokens 0–{done - 1} wait in the KV pool for the next piece"
        s.text(20, 120, waiting, size=13, muted=True)
    elif done == prompt_len:
        s.text(20, 120, f"all {prompt_len} prompt tokens are in the KV pool", size=13, muted=True)
    legend = [(CYAN, 0.35, "K/V in the pool"), (ORANGE, 0.65, "this step"), (GREY, 0.12, "to come")]
    x = WIDTH - 20 - sum(30 + len(label) * 6.4 for _, _, label in legend)
    for colour, opacity, label in legend:
        s.box(x, 43, 12, 12, colour, rx=2, fill_opacity=opacity, stroke_width=0.8)
        s.text(x + 17, 54, label, size=12)
        x += 30 + len(label) * 6.4


def describe(run: Run, view: StepView, uid: int) -> str:
    p = view.piece(uid)
    if p is None:
        return run.state(uid, view)
    if view.phase == "decode":
        return f"decode: position {p.start} → token {view.made[uid]}"
    if uid == LONG_UID and len(run.long_steps) > 1:
        what = "a ChunkedReq, samples nothing" if p.chunked else "a Req, samples token 1"
        return f"prefill, {run.piece_label(view.step)}: tokens {p.start}–{p.end - 1} ({what})"
    return f"prefill, whole prompt: tokens {p.start}–{p.end - 1} → token 1"


def draw_rows(s: Svg, run: Run, view: StepView, y: float) -> None:
    uids = sorted({u for v in run.upto(view) for u in v.arrived})
    for uid in uids:
        colour = OWNER_COLOURS[uid % len(OWNER_COLOURS)]
        piece = view.piece(uid)
        in_batch = piece is not None
        s.pill(20, y, f"r{uid}", colour)
        s.text(62, y + 4.5, describe(run, view, uid), size=13, muted=not in_batch)
        made, max_tokens = view.made.get(uid, 0), run.sizes[uid][1]
        new = 1 if piece is not None and not piece.chunked else 0
        x = WIDTH - 20 - max_tokens * 12
        s.text(x - 8, y + 4.5, f"{made} of {max_tokens}", size=12, anchor="end", muted=True)
        for j in range(max_tokens):
            if j < made:
                opacity = 0.85 if j >= made - new else 0.3
                s.box(
                    x + j * 12, y - 8, 10, 16, GREEN, rx=2, fill_opacity=opacity, stroke_width=0.8
                )
            else:
                s.box(x + j * 12, y - 8, 10, 16, None, rx=2, dashed=True, stroke_width=0.8)
        y += 25


def draw_budget(s: Svg, view: StepView, y: float) -> None:
    w = (WIDTH - 40) / BUDGET
    if view.phase == "prefill":
        parts = ", ".join(f"r{p.uid} {p.size}" for p in view.pieces)
        caption = f"prefill budget (max_extend_tokens = {BUDGET}): {view.tokens()} used ({parts})"
    else:
        caption = (
            f"a decode step: {view.tokens()} tokens, one per running request "
            f"(the budget bounds prefill batches)"
        )
    s.text(20, y, caption, size=13)
    x = 20.0
    for p in view.pieces if view.phase == "prefill" else []:
        colour = OWNER_COLOURS[p.uid % len(OWNER_COLOURS)]
        s.box(x, y + 8, p.size * w - 2, 20, colour, rx=3, fill_opacity=0.45)
        if p.size * w > 40:
            s.text(x + p.size * w / 2, y + 22, f"r{p.uid}: {p.size}", size=12, anchor="middle")
        x += p.size * w
    if x < WIDTH - 20:
        s.box(x, y + 8, WIDTH - 20 - x, 20, None, rx=3, dashed=True)


def draw_steps(s: Svg, run: Run, view: StepView, y: float) -> None:
    """Every step of the run as a column; those so far as bars as tall as their tokens."""
    s.text(20, y, "the steps so far, each bar as tall as the tokens it computed", size=13)
    col = (WIDTH - 40) / len(run.views)
    base, scale = y + 84, 60 / BUDGET
    now = run.views.index(view)
    for i, v in enumerate(run.views):
        x = 20 + i * col
        s.text(x + col / 2, base + 16, str(v.step), size=12, anchor="middle", muted=i != now)
        if i > now:
            continue
        colour = ORANGE if v.phase == "prefill" else GREEN
        h = max(v.tokens() * scale, 3)
        s.box(x + 6, base - h, col - 12, h, colour, rx=2, fill_opacity=0.8 if v is view else 0.35)
        s.text(x + col / 2, base - h - 5, str(v.tokens()), size=12, anchor="middle")
    s.box(WIDTH - 230, y - 11, 12, 12, ORANGE, rx=2, fill_opacity=0.5)
    s.text(WIDTH - 212, y, "prefill", size=12)
    s.box(WIDTH - 150, y - 11, 12, 12, GREEN, rx=2, fill_opacity=0.5)
    s.text(WIDTH - 132, y, "decode", size=12)


def draw(run: Run, view: StepView, decode: Callable[[List[int]], str]) -> str:
    title = f"step {view.step} · {view.phase} batch: {names(p.uid for p in view.pieces)}"
    s = Svg("anim-chunked", WIDTH, HEIGHT, "Chunked prefill", title)
    s.text(20, 26, title, size=15, bold=True)
    queue = ", ".join(f"r{u}" for u in view.waiting) or "empty"
    s.text(WIDTH - 20, 26, f"waiting list: {queue}", size=13, anchor="end")
    draw_prompt(s, run, view, decode)
    draw_rows(s, run, view, 150)
    draw_budget(s, view, 268)
    draw_steps(s, run, view, 336)
    return s.render()


def record() -> Animation:
    from examples.helpers.scripted import ScriptedScheduler, make_config, user_msg
    from minisgl.env import ENV
    from minisgl.scheduler.prefill import ChunkedReq, PrefillAdder
    from tools.parity import load_tokenizer

    tok = load_tokenizer(MODEL)
    msgs = [user_msg(i, tok(text).input_ids, n) for i, (_, text, n) in enumerate(REQUESTS)]
    sizes = {m.uid: (len(m.input_ids), m.sampling_params.max_tokens) for m in msgs}
    views: List[StepView] = []
    refused: List[Tuple[int, int]] = []

    class Recording(ScriptedScheduler):
        """Remembers what arrived and what ran in a step, and snapshots the step after it."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.arrived: List[int] = []
            self.pieces: List[Piece] = []
            self.phase = ""

        def offline_receive_msg(self, blocking: bool = False):
            msgs = super().offline_receive_msg(blocking)
            self.arrived = [m.uid for m in msgs]
            return msgs

        def _forward(self, forward_input):
            batch = forward_input.batch
            self.phase = batch.phase
            self.pieces = [
                Piece(
                    r.uid,
                    r.cached_len,
                    r.device_len,
                    isinstance(r, ChunkedReq),
                    tuple(r.input_ids[r.cached_len : r.device_len].tolist()),
                )
                for r in batch.reqs
            ]
            return super()._forward(forward_input)

        def normal_loop(self) -> None:
            refused.clear()
            self.pieces = []
            super().normal_loop()
            if self.pieces:
                views.append(
                    StepView(
                        self.step,
                        self.phase,
                        self.pieces,
                        self.arrived,
                        list(refused),
                        [p.uid for p in self.prefill_manager.pending_list],
                        {uid: len(out) for uid, out in self.outputs.items()},
                        sorted(u for u, s in self.finish_step.items() if s == self.step),
                    )
                )

    try_add_one = PrefillAdder.try_add_one

    def recording_try_add_one(adder: PrefillAdder, pending_req):
        left = adder.token_budget
        req = try_add_one(adder, pending_req)
        if req is None:
            refused.append((pending_req.uid, left))
        return req

    # the naive cache: no prefix match, so the pieces start where the budget cut them
    config = make_config(MODEL, max_extend_tokens=BUDGET, cache_type="naive")
    overlap_off = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # chapter 10's loop: one batch at a time
    PrefillAdder.try_add_one = recording_try_add_one  # type: ignore[method-assign]
    try:
        sched = Recording(config, [(REQUESTS[m.uid][0], m) for m in msgs])
        try:
            sched.run()
            sched.cache_manager.check_integrity()
        finally:
            sched.shutdown()
    finally:
        PrefillAdder.try_add_one = try_add_one  # type: ignore[method-assign]
        ENV.DISABLE_OVERLAP_SCHEDULING.value = overlap_off
    run = Run(views, sizes)
    animation = Animation(NAME, "Chunked prefill: a long prompt under a token budget")
    for view in views:
        animation.add(draw(run, view, tok.decode), narrate(run, view))
    return animation
