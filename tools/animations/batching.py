"""Continuous batching and admission control (chapter 08), recorded from a real run.

Six requests of different lengths arrive at different steps into a KV pool of 16 pages of 4
tokens; the book's scripted scheduler (``examples/helpers/scripted.py``) drives the real
scheduler on the tiny Qwen3 model, with chapter 08's plain loop (no overlap). After every step
the recorder snapshots the real objects: the waiting list, the batch that ran and the tokens
each request computed in it, every page of the pool and its owner, what the running requests
may still need (the promise), and each admission check ``PrefillAdder.try_add_one`` made, with
the numbers it compared. Each frame draws one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

from tools.animations import Animation
from tools.figures.svg import AMBER, BLUE, CYAN, GREEN, GREY, ORANGE, PURPLE, RED, TEAL, Svg

NAME = "continuous-batching"
SOURCES = [
    "tools/animations/batching.py",
    "tools/animations/__init__.py",
    "examples/helpers/scripted.py",
    "minisgl/scheduler/scheduler.py",
    "minisgl/scheduler/prefill.py",
    "minisgl/scheduler/decode.py",
    "minisgl/scheduler/cache.py",
]
MODEL = "tiny-qwen3"
PAGE_SIZE, NUM_PAGES = 4, 16
REQUESTS = [  # (arrival step, prompt, max_tokens)
    (0, "The capital of France is", 10),
    (0, "Water boils at", 16),
    (2, "def add(a, b):", 8),
    (3, "Once upon a time, in a village between two rivers,", 12),
    (4, "The sky is", 4),
    (9, "One, two,", 6),
]
OWNER_COLOURS = [BLUE, TEAL, PURPLE, AMBER, RED, GREY]  # one per request, in rows and pages
WIDTH, HEIGHT = 940, 468
CELL = 13  # width of one token's cell


@dataclass(frozen=True)
class Check:
    """One call of PrefillAdder.try_add_one: what it compared, and its answer."""

    uid: int
    need: int  # slots to its last possible token, in whole pages (_new_slots)
    promised: int  # slots already promised when it was checked (reserved_size)
    available: int  # slots a new request could get (CacheManager.available_size)
    free_rows: int  # request slots left (TableManager.available_size)
    budget: int  # prompt tokens this batch could still compute (token_budget)
    admitted: bool

    def comparison(self) -> str:
        if self.admitted or self.need + self.promised > self.available:
            verdict = "≤" if self.admitted else ">"
            return (
                f"{self.need} slots + {self.promised} promised = {self.need + self.promised} "
                f"{verdict} {self.available} available"
            )
        if self.free_rows == 0:
            return "no request slot is free"
        return f"the prompt-token budget is spent ({self.budget} left)"

    def line(self) -> str:
        return f"r{self.uid}: {self.comparison()} → {'admitted' if self.admitted else 'waits'}"


@dataclass(frozen=True)
class ReqView:
    uid: int
    prompt_len: int
    max_tokens: int
    state: str  # waiting, prefill, decode (in this step's batch), idle (running, not in it), done
    computed_before: int  # its tokens whose K/V were in the pool before this step
    computed_now: int  # ... and after it
    outputs_before: int
    outputs_now: int
    pages: int  # pages it holds after the step
    remain: int  # tokens it may still make (Req.remain_len)
    finished_now: bool


@dataclass(frozen=True)
class StepView:
    step: int
    phase: str
    arrived: List[int]
    checks: List[Check]
    waiting: List[int]  # the waiting list after the step, in order
    reqs: List[ReqView]
    owners: List[Optional[int]]  # per page of the pool: the uid of its owner, None if free
    written: List[int]  # per page: how many of its slots hold a token's K/V
    promised: int  # DecodeManager.inflight_tokens after the step
    free_pages: int


def names(uids: Iterable[int]) -> str:
    out = [f"r{u}" for u in uids]
    return out[0] if len(out) == 1 else ", ".join(out[:-1]) + " and " + out[-1]


def narrate(view: StepView) -> str:
    """In the order it happened: the admission checks, the batch, the requests it finished."""
    clauses = []
    admitted = [c.uid for c in view.checks if c.admitted]
    if admitted:
        one = len(admitted) == 1
        verb = "is admitted" if one else "are admitted"
        if all(u in view.arrived for u in admitted):
            verb = ("arrives and " if one else "arrive and ") + verb
        clauses.append(f"{names(admitted)} {verb}")
    for c in view.checks:
        if not c.admitted:
            verb = "arrives and waits" if c.uid in view.arrived else "still waits"
            clauses.append(f"r{c.uid} {verb}: {c.comparison().replace(' slots', '')}")
    checked = {c.uid for c in view.checks}
    behind = [u for u in view.arrived if u in view.waiting and u not in checked]
    if behind:
        verb = "arrives and queues" if len(behind) == 1 else "arrive and queue"
        clauses.append(f"{names(behind)} {verb} behind r{view.waiting[0]}")
    ran = [r for r in view.reqs if r.state in ("prefill", "decode")]
    if view.phase == "prefill":
        tokens = sum(r.computed_now - r.computed_before for r in ran)
        step = f"a prefill computes {'its' if len(ran) == 1 else 'their'} {tokens} prompt tokens"
        idle = [r.uid for r in view.reqs if r.state == "idle"]
        if idle:
            step += f" while {names(idle)} sit{'s' if len(idle) == 1 else ''} out"
    else:
        each = "a token" if len(ran) == 1 else "a token each"
        step = f"a decode step gives {names(r.uid for r in ran)} {each}"
    done = [r.uid for r in view.reqs if r.finished_now]
    if done:
        frees = "is done and frees its" if len(done) == 1 else "are done and free their"
        step += f"; {names(done)} {frees} pages"
    if not clauses:
        return f"Step {view.step}: {step}."
    return f"Step {view.step}: {'; '.join(clauses)}. Then {step}."


def draw_row(s: Svg, y: float, r: ReqView) -> None:
    s.pill(20, y, f"r{r.uid}", OWNER_COLOURS[r.uid % len(OWNER_COLOURS)])
    state = {"idle": "running, idle"}.get(r.state, r.state)
    if r.finished_now and r.state != "done":
        state += ", done"
    s.text(62, y + 4.5, state, size=12, muted=r.state in ("idle", "done"))
    x = 160.0
    for i in range(r.prompt_len):
        colour, opacity = (
            (CYAN, 0.35)
            if i < r.computed_before
            else (ORANGE, 0.6)
            if i < r.computed_now
            else (GREY, 0.12)
        )
        s.box(x, y - 8, CELL - 2, 16, colour, rx=2, fill_opacity=opacity, stroke_width=0.8)
        x += CELL
    x += 5
    for j in range(r.max_tokens):
        if j < r.outputs_now:
            new = j >= r.outputs_before
            opacity, stroke = (0.85, 1.2) if new else (0.3, 0.8)
            s.box(x, y - 8, CELL - 2, 16, GREEN, rx=2, fill_opacity=opacity, stroke_width=stroke)
        elif r.state != "done" and not r.finished_now:
            s.box(x, y - 8, CELL - 2, 16, None, rx=2, dashed=True, stroke_width=0.8)
        x += CELL
    info = f"prompt {r.prompt_len}, max {r.max_tokens} · {r.outputs_now} made"
    if r.state not in ("waiting", "done") and not r.finished_now:
        pages = f"{r.pages} page" + ("s" if r.pages != 1 else "")
        info += f" · {pages} · may make {r.remain} more"
    s.text(500, y + 4.5, info, size=12)


def draw_pool(s: Svg, y: float, view: StepView) -> None:
    s.text(
        20,
        y,
        f"KV pool after the step: {NUM_PAGES} pages of {PAGE_SIZE} slots, in page order",
        size=13,
    )
    page_w, y = PAGE_SIZE * 13 + 4, y + 10
    for page, (owner, written) in enumerate(zip(view.owners, view.written)):
        x = 20 + page * page_w
        colour = None if owner is None else OWNER_COLOURS[owner % len(OWNER_COLOURS)]
        for k in range(PAGE_SIZE):
            opacity = 0.7 if k < written else 0.15
            s.box(x + k * 13, y, 12, 18, colour, rx=2, fill_opacity=opacity, stroke_width=0.8)
        label = "free" if owner is None else f"r{owner}"
        s.text(x + page_w / 2 - 2, y + 34, label, size=12, anchor="middle", muted=owner is None)


def draw_promise(s: Svg, y: float, view: StepView) -> None:
    """All slots in one bar: held by each request, promised to the running ones, spare."""
    total, free = NUM_PAGES * PAGE_SIZE, view.free_pages * PAGE_SIZE
    promised = min(view.promised, free)
    s.text(
        20,
        y,
        f"slots: {total - free} held · {view.promised} of the {free} free promised to the "
        f"running requests' future tokens · {free - promised} spare for a newcomer",
        size=13,
    )
    held: Dict[int, int] = {}
    for owner in view.owners:
        if owner is not None:
            held[owner] = held.get(owner, 0) + PAGE_SIZE
    x, w = 20.0, (WIDTH - 40) / total
    for owner, n in sorted(held.items()):
        s.box(x, y + 8, n * w - 2, 16, OWNER_COLOURS[owner % len(OWNER_COLOURS)], rx=3)
        x += n * w
    if promised > 0:
        s.box(x, y + 8, promised * w - 2, 16, None, rx=3, dashed=True)
        s.text(x + promised * w / 2, y + 20.5, "promised", size=12, anchor="middle", muted=True)
        x += promised * w
    if free > promised:
        s.box(x, y + 8, (free - promised) * w, 16, GREY, rx=3, fill_opacity=0.1)


def draw(view: StepView) -> str:
    batch = [r.uid for r in view.reqs if r.state in ("prefill", "decode")]
    title = f"step {view.step} · {view.phase} batch: {names(batch)}"
    s = Svg("anim-batching", WIDTH, HEIGHT, "Continuous batching", title)
    s.text(20, 26, title, size=15, bold=True)
    queue = ", ".join(f"r{u}" for u in view.waiting) or "empty"
    s.text(WIDTH - 20, 26, f"waiting list: {queue}", size=13, anchor="end")
    header = "prompt tokens | output tokens (dashed: promised, not made yet)"
    s.text(160, 50, header, size=12, muted=True)
    for i, r in enumerate(view.reqs):
        draw_row(s, 70 + 25 * i, r)
    draw_pool(s, 234, view)
    draw_promise(s, 308, view)
    heading = "admission checks at the start of the step (PrefillAdder.try_add_one):"
    s.text(20, 364, heading, size=13, bold=True)
    lines = [c.line() for c in view.checks] or ["none: no request was waiting"]
    unchecked = [u for u in view.waiting if u not in {c.uid for c in view.checks}]
    if view.checks and not view.checks[-1].admitted and unchecked:
        lines.append(f"{names(unchecked)}: not checked, behind it (first come, first served)")
    s.lines(20, 384, lines[:3], size=13, gap=1.4, mono=True)
    legend = [
        (CYAN, 0.35, "K/V in the pool"),
        (ORANGE, 0.6, "computed in this step"),
        (GREY, 0.12, "not computed yet"),
        (GREEN, 0.3, "output token"),
        (GREEN, 0.85, "made in this step"),
    ]
    x = 20.0
    for colour, opacity, label in legend:
        s.box(x, HEIGHT - 24, 12, 14, colour, rx=2, fill_opacity=opacity, stroke_width=0.8)
        s.text(x + 18, HEIGHT - 12, label, size=12)
        x += 36 + len(label) * 6.6
    return s.render()


def pool_owners(sched, running) -> Tuple[List[Optional[int]], List[int]]:
    """Each page's owner and how many of its slots are written, from the page table's rows;
    checked against the free list, so a page held twice or lost would stop the recording."""
    owners: List[Optional[int]] = [None] * NUM_PAGES
    written = [0] * NUM_PAGES
    for req in running:
        for slot in sched.engine.page_table[req.table_idx, : req.cached_len].tolist():
            page = slot // PAGE_SIZE
            assert owners[page] in (None, req.uid), f"page {page} has two owners"
            owners[page] = req.uid
            written[page] += 1
    free = {slot // PAGE_SIZE for slot in sched.cache_manager.free_slots.tolist()}
    held = {p for p, o in enumerate(owners) if o is not None}
    assert free.isdisjoint(held) and len(free) + len(held) == NUM_PAGES, "a page is lost"
    return owners, written


def record() -> Animation:
    from examples.helpers.scripted import ScriptedScheduler, make_config, user_msg
    from minisgl.env import ENV
    from minisgl.scheduler.prefill import PrefillAdder
    from tools.parity import load_tokenizer

    tok = load_tokenizer(MODEL)
    msgs = [user_msg(i, tok(text).input_ids, n) for i, (_, text, n) in enumerate(REQUESTS)]
    sizes = {m.uid: (len(m.input_ids), m.sampling_params.max_tokens) for m in msgs}
    animation = Animation(NAME, "Continuous batching and admission control, step by step")
    checks: List[Check] = []
    matched: Dict[str, int] = {}
    previous: Dict[int, ReqView] = {}

    class Recording(ScriptedScheduler):
        """Remembers what arrived and what ran in a step, and snapshots the step after it."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.arrived: List[int] = []
            self.ran: Dict[int, int] = {}  # uid -> its cached_len before the step
            self.phase = ""

        def offline_receive_msg(self, blocking: bool = False):
            msgs = super().offline_receive_msg(blocking)
            self.arrived = [m.uid for m in msgs]
            return msgs

        def _forward(self, forward_input):
            self.phase = forward_input.batch.phase
            self.ran = {r.uid: r.cached_len for r in forward_input.batch.reqs}
            return super()._forward(forward_input)

        def normal_loop(self) -> None:
            checks.clear()
            self.ran = {}
            super().normal_loop()
            if self.ran:
                snapshot(self)

    def view_of(sched: Recording, uid: int, live, waiting, owners) -> ReqView:
        before, req = previous.get(uid), live.get(uid)
        if uid in sched.ran:
            state = sched.phase
        else:
            state = "idle" if req else "waiting" if uid in waiting else "done"
        computed_before = sched.ran.get(uid, before.computed_now if before else 0)
        return ReqView(
            uid,
            *sizes[uid],
            state,
            computed_before,
            req.cached_len if req else computed_before,
            before.outputs_now if before else 0,
            len(sched.outputs.get(uid, [])),
            sum(o == uid for o in owners),
            req.remain_len if req else 0,
            sched.finish_step.get(uid) == sched.step,
        )

    def snapshot(sched: Recording) -> None:
        running = list(sched.decode_manager.running_reqs)
        live = {r.uid: r for r in running}
        waiting = [p.uid for p in sched.prefill_manager.pending_list]
        owners, written = pool_owners(sched, running)
        uids = sorted(set(previous) | set(sched.ran) | set(waiting))
        view = StepView(
            sched.step,
            sched.phase,
            list(sched.arrived),
            list(checks),
            waiting,
            [view_of(sched, uid, live, waiting, owners) for uid in uids],
            owners,
            written,
            sched.decode_manager.inflight_tokens,
            len(sched.cache_manager.free_slots),
        )
        animation.add(draw(view), narrate(view))
        previous.update({r.uid: r for r in view.reqs})

    try_add_one = PrefillAdder.try_add_one

    def recording_try_add_one(adder: PrefillAdder, pending_req):
        numbers = (
            adder.reserved_size,
            adder.cache_manager.available_size,
            adder.table_manager.available_size,
            adder.token_budget,
        )
        matched.clear()
        req = try_add_one(adder, pending_req)
        need = adder._new_slots(pending_req, matched.get("cached_len", 0))
        checks.append(Check(pending_req.uid, need, *numbers, admitted=req is not None))
        return req

    config = make_config(
        MODEL, page_size=PAGE_SIZE, num_page_override=NUM_PAGES, cache_type="naive"
    )
    overlap_off = ENV.DISABLE_OVERLAP_SCHEDULING.value
    ENV.DISABLE_OVERLAP_SCHEDULING.value = True  # chapter 08's loop: one batch at a time
    PrefillAdder.try_add_one = recording_try_add_one  # type: ignore[method-assign]
    try:
        sched = Recording(config, [(REQUESTS[m.uid][0], m) for m in msgs])
        match_req = sched.cache_manager.match_req

        def recording_match(req):
            result = match_req(req)
            matched["cached_len"] = result.cuda_handle.cached_len
            return result

        sched.cache_manager.match_req = recording_match  # type: ignore[method-assign]
        try:
            sched.run()
            sched.cache_manager.check_integrity()
        finally:
            sched.shutdown()
    finally:
        PrefillAdder.try_add_one = try_add_one  # type: ignore[method-assign]
        ENV.DISABLE_OVERLAP_SCHEDULING.value = overlap_off
    return animation
