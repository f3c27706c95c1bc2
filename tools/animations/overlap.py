"""Overlap scheduling (chapter 11), recorded from real runs of ``LLM.generate``.

SmolLM2 answers two prompts, three tokens each, with the overlap loop, twice: once with our
scheduler and once with upstream's result processing mixed in (``UpstreamLogic`` of
tests/test_ch11_overlap.py). The recorder subclasses the LLM as chapter 11's main does,
wrapping the loop's turn, the launch (``_forward``), the processing (``_process_last_data``),
the release of a request and the messages sent, and draws after each event: the host's
events and the batches in flight in the order they happened (a CPU runs each forward pass
inside its launch, so only the order is real, not the durations), every request's lengths,
and the messages a client receives.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Dict, List, Sequence, Set, Tuple

from tools.animations import Animation
from tools.figures.svg import GREEN, GREY, ORANGE, PURPLE, RED, Svg, text_width

if TYPE_CHECKING:
    from minisgl.core import Req

NAME = "overlap-scheduling"
SOURCES = [
    "tools/animations/overlap.py",
    "tools/animations/__init__.py",
    "minisgl/scheduler/scheduler.py",
    "minisgl/llm/llm.py",
    "tests/test_ch11_overlap.py",
]
PROMPTS = ["The capital of France is", "Water boils at"]
MAX_TOKENS = 3
WIDTH, HEIGHT = 940, 480
LANE_X, COL_W = 130, 132
HOST_Y, DEVICE_Y, TABLE_Y, MESSAGES_Y = 60, 130, 238, 314


@dataclass(frozen=True)
class ReqView:
    uid: int
    prompt_len: int
    host_len: int  # len(input_ids): the prompt and every token processed so far
    device_len: int
    max_device_len: int
    can_decode: bool
    running: bool  # in the decode manager's running set
    slot: int
    released: bool


@dataclass(frozen=True)
class Message:
    uid: int
    text: str  # the token, decoded
    finished: bool


@dataclass(frozen=True)
class Event:
    kind: str  # "launch" or "process"
    turn: int
    batch: int  # B1, B2, ... in order of launch
    phase: str
    uids: List[int]
    reqs: List[ReqView]  # every request, right after the event
    sent: List[Message]
    freed: List[Tuple[int, bool]]  # (uid, whether the batch in flight still holds it)


@dataclass
class Run:
    label: str  # "ours" or "upstream"
    events: List[Event] = field(default_factory=list)
    arrived: List[ReqView] = field(default_factory=list)  # the requests before the first launch

    def messages(self, upto: int) -> List[Message]:
        return [m for e in self.events[: upto + 1] for m in e.sent]

    def index(self, kind: str, batch: int) -> int:
        return next(i for i, e in enumerate(self.events) if (e.kind, e.batch) == (kind, batch))


def listed(items: Sequence[object]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def early_or_late(stream: List[Message], everything: List[Message]) -> List[bool]:
    """Which messages of one request's stream are wrong for a client: finished=True with
    more to come (in the whole run), or anything after a finished=True."""
    wrong, seen_finished = [], False
    for i, m in enumerate(stream):
        more = i < len(everything) - 1
        wrong.append(seen_finished or (m.finished and more))
        seen_finished = seen_finished or m.finished
    return wrong


def client_text(stream: List[Message]) -> str:
    """What a streaming client shows: tokens up to the first finished=True."""
    text = ""
    for m in stream:
        text += m.text
        if m.finished:
            break
    return text


# --------------------------------------------------------------------------------- drawing
def column_x(i: int) -> float:
    return LANE_X + i * COL_W


def draw_timeline(s: Svg, events: List[Event], marked: int) -> None:
    """The host's events in order, one column each, grouped by the loop's turns."""
    s.text(20, HOST_Y + 27, "host (CPU)", size=13, bold=True)
    for i, e in enumerate(events):
        x = column_x(i)
        if i == 0 or events[i - 1].turn != e.turn:
            s.text(x + 4, HOST_Y - 8, f"turn {e.turn}", size=12, muted=True)
            if i > 0:
                s.line(x - 4, HOST_Y - 22, x - 4, HOST_Y + 58, color=GREY, dashed=True, width=1)
        hue = PURPLE if e.kind == "launch" else ORANGE
        s.box(
            x,
            HOST_Y,
            COL_W - 8,
            58,
            hue,
            rx=6,
            stroke_width=2.4 if i == marked else 1.2,
            fill_opacity=0.3 if i == marked else 0.12,
        )
        s.text(x + 8, HOST_Y + 18, f"{e.kind} B{e.batch}", size=13, bold=True)
        who = ", ".join(f"r{u}" for u in e.uids)
        s.text(x + 8, HOST_Y + 34, f"{e.phase} of {who}", size=12)
        if e.freed:
            early = any(in_flight for _, in_flight in e.freed)
            freed = ", ".join(f"r{u}" for u, _ in e.freed)
            s.text(
                x + 8,
                HOST_Y + 50,
                f"frees {freed}" + (" in flight" if early else ""),
                size=12,
                bold=early,
                color=RED if early else None,
            )
    draw_in_flight(s, events)


def draw_in_flight(s: Svg, events: List[Event]) -> None:
    """Each batch as a bar from its launch to its processing: on a GPU, the device's queue."""
    s.text(20, DEVICE_Y + 18, "device", size=13, bold=True)
    s.text(20, DEVICE_Y + 36, "batches in flight", size=12, muted=True)
    launched = {e.batch: i for i, e in enumerate(events) if e.kind == "launch"}
    done = {e.batch: i for i, e in enumerate(events) if e.kind == "process"}
    for batch, start in launched.items():
        end = done.get(batch)
        x1 = column_x(start)
        x2 = column_x(end) + COL_W - 8 if end is not None else column_x(len(events)) - 8
        y = DEVICE_Y + (batch % 2) * 26
        s.box(
            x1, y, x2 - x1, 22, PURPLE, rx=5, dashed=end is None, fill_opacity=0.16, stroke_width=1
        )
        state = "in flight" if end is None else "launched → processed"
        s.text(x1 + 8, y + 16, f"B{batch}: {state}", size=12)
    s.arrow(LANE_X, DEVICE_Y + 62, WIDTH - 20, DEVICE_Y + 62, color=GREY, width=1.2)
    s.text(
        WIDTH - 20,
        DEVICE_Y + 80,
        "the real run's order of events, not their durations",
        size=12,
        anchor="end",
        muted=True,
    )


TABLE_COLUMNS = [  # label, x, the ReqView field shown
    ("request", 20, "uid"),
    ("prompt", 100, "prompt_len"),
    ("len(input_ids)", 170, "host_len"),
    ("device_len", 300, "device_len"),
    ("max_device_len", 400, "max_device_len"),
    ("can_decode", 530, "can_decode"),
    ("running", 630, "running"),
    ("slot", 720, "slot"),
]


def cell(r: ReqView, attr: str) -> str:
    if attr == "uid":
        return f"r{r.uid}"
    if attr == "slot":
        return f"{r.slot}, freed" if r.released else str(r.slot)
    return str(getattr(r, attr))


def draw_table(s: Svg, reqs: List[ReqView], changed: Dict[int, List[str]]) -> None:
    for label, x, attr in TABLE_COLUMNS:
        s.text(x, TABLE_Y, label, size=12, muted=True, mono=attr not in ("uid", "prompt_len"))
    for row, r in enumerate(reqs):
        y = TABLE_Y + 22 + row * 20
        for _, x, attr in TABLE_COLUMNS:
            s.text(x, y, cell(r, attr), size=13, bold=attr in changed.get(r.uid, []))


def chip(s: Svg, x: float, y: float, m: Message, wrong: bool, last: bool) -> float:
    label = f"{m.text!r}, {m.finished}"
    w = text_width(label, 12, mono=True) + 14
    hue = RED if wrong else (GREEN if m.finished and last else GREY)
    s.box(
        x,
        y,
        w,
        22,
        hue,
        rx=5,
        fill_opacity=0.28 if wrong or m.finished else 0.12,
        stroke_width=1.6 if wrong else 1,
    )
    s.text(x + 7, y + 15.5, label, size=12, mono=True)
    return w


def draw_messages(s: Svg, rows: List[Tuple[str, List[Message], List[Message]]]) -> None:
    """Each row: its label, the messages sent so far, and the request's whole stream."""
    s.text(
        20,
        MESSAGES_Y,
        "messages sent (DetokenizeMsg: next_token decoded, finished)",
        size=12,
        muted=True,
    )
    s.text(WIDTH - 20, MESSAGES_Y, "a streaming client shows", size=12, anchor="end", muted=True)
    for row, (label, sent, everything) in enumerate(rows):
        y = MESSAGES_Y + 12 + row * 30
        s.text(20, y + 16, label, size=13, bold=True)
        x = 130.0
        wrong = early_or_late(sent, everything)
        for i, m in enumerate(sent):
            x += chip(s, x, y, m, wrong[i], i == len(everything) - 1) + 6
        if sent:
            s.text(WIDTH - 20, y + 16, repr(client_text(sent)), size=13, anchor="end", mono=True)


def draw_legend(s: Svg) -> None:
    y, x = HEIGHT - 14, 20.0
    for label, hue in [
        ("finished=False", GREY),
        ("finished=True on the last token", GREEN),
        ("finished=True too early, or a message after it", RED),
    ]:
        s.box(x, y - 11, 14, 14, hue, rx=3, fill_opacity=0.3, stroke_width=1)
        s.text(x + 20, y, label, size=12, muted=True)
        x += 36 + text_width(label, 12)


def draw(
    title: str,
    run: Run,
    upto: int,
    rows: List[Tuple[str, List[Message], List[Message]]],
    changed: Dict[int, List[str]],
) -> str:
    s = Svg("anim-overlap", WIDTH, HEIGHT, "Overlap scheduling", title)
    s.text(20, 28, title, size=15, bold=True)
    events = run.events[: upto + 1] if upto >= 0 else []
    draw_timeline(s, events, upto)
    draw_table(s, events[-1].reqs if events else run.arrived, changed)
    draw_messages(s, rows)
    draw_legend(s)
    return s.render()


# -------------------------------------------------------------------------------- recording
def traced(base: type, run: Run, decode: Callable[[List[int]], str]) -> type:
    """`base` (an LLM class) with its loop's events recorded into `run`."""

    class Traced(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.turn = 0
            self.numbers: Dict[int, int] = {}  # id(batch) -> its B number
            self.reqs: Dict[int, Req] = {}  # by uid
            self.released: Set[int] = set()  # uids
            self.sent: List[Message] = []
            self.freed: List[Tuple[int, bool]] = []

        def overlap_loop(self, last_data):
            self.turn += 1
            return super().overlap_loop(last_data)

        def _forward(self, forward_input):
            batch = forward_input.batch
            if not self.reqs:
                run.arrived.extend(self.views(batch.reqs))
            output = super()._forward(forward_input)
            self.numbers[id(batch)] = len(self.numbers) + 1
            self.reqs.update({r.uid: r for r in batch.reqs})
            self.event("launch", batch)
            return output

        def _process_last_data(self, last_data) -> None:
            super()._process_last_data(last_data)
            if last_data is not None:
                self.event("process", last_data[0].batch)

        def _free_req_resources(self, req) -> None:
            self.freed.append((req.uid, req in self._in_flight))
            self.released.add(req.uid)
            super()._free_req_resources(req)

        def offline_send_result(self, reply) -> None:
            self.sent += [Message(m.uid, decode([m.next_token]), m.finished) for m in reply]
            super().offline_send_result(reply)

        def views(self, reqs) -> List[ReqView]:
            return [
                ReqView(
                    r.uid,
                    r.max_device_len - r.output_len,
                    len(r.input_ids),
                    r.device_len,
                    r.max_device_len,
                    r.can_decode,
                    r in self.decode_manager.running_reqs,
                    r.table_idx,
                    r.uid in self.released,
                )
                for r in reqs
            ]

        def event(self, kind: str, batch) -> None:
            number = self.numbers[id(batch)]
            uids = [r.uid for r in batch.reqs]
            views = self.views(self.reqs.values())
            run.events.append(
                Event(kind, self.turn, number, batch.phase, uids, views, self.sent, self.freed)
            )
            self.sent, self.freed = [], []

    return Traced


def upstream_llm() -> type:
    """Upstream's processing on our LLM; its LLM keeps whatever arrives after "finished"."""
    from minisgl.llm import LLM
    from tests.test_ch11_overlap import UpstreamLogic

    class UpstreamLLM(UpstreamLogic, LLM):
        def offline_send_result(self, reply) -> None:
            for msg in reply:
                status = self.status_map[msg.uid]
                status.output_ids.append(msg.next_token)
                status.finished = status.finished or msg.finished

    return UpstreamLLM


def run_once(base: type, label: str) -> Run:
    import torch

    from minisgl.core import SamplingParams
    from tools.models import SMOLLM2, ensure_model
    from tools.parity import load_tokenizer

    run = Run(label)
    tok = load_tokenizer(SMOLLM2)
    llm = traced(base, run, tok.decode)(
        str(ensure_model(SMOLLM2)), dtype=torch.float32, max_running_req=4, num_page_override=64
    )
    try:
        llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS))
    finally:
        llm.shutdown()
    return run


# ---------------------------------------------------------------------------------- frames
def rows_of(run: Run, upto: int, label: str = "") -> List[Tuple[str, List[Message], List[Message]]]:
    uids = sorted({m.uid for m in run.messages(len(run.events))})
    return [
        (
            f"{label}r{uid}",
            [m for m in run.messages(upto) if m.uid == uid],
            [m for m in run.messages(len(run.events)) if m.uid == uid],
        )
        for uid in uids
    ]


def changes(run: Run, i: int) -> Dict[int, List[str]]:
    """The table's cells that event i changed, per request (drawn bold)."""
    before = {r.uid: r for r in run.events[i - 1].reqs} if i > 0 else {}
    return {
        r.uid: [a for _, _, a in TABLE_COLUMNS if cell(r, a) != cell(before[r.uid], a)]
        for r in run.events[i].reqs
        if r.uid in before
    }


def values(e: Event, attr: str) -> str:
    return listed([cell(r, attr) for r in e.reqs if r.uid in e.uids])


def pending(run: Run, i: int) -> List[int]:
    """Batches launched before event i and not processed before it."""
    launched = [e.batch for e in run.events[:i] if e.kind == "launch"]
    processed = {e.batch for e in run.events[:i] if e.kind == "process"}
    return [b for b in launched if b not in processed]


def sent_line(e: Event) -> str:
    flags = {m.finished for m in e.sent}
    said = listed([f"{m.text!r} for r{m.uid}" for m in e.sent])
    if len(flags) == 1:
        return f"{said} go{'es' * (len(e.sent) == 1)} out with finished={flags.pop()}"
    return said + " go out with finished=" + listed([str(m.finished) for m in e.sent])


def narrate_launch(run: Run, i: int) -> str:
    e = run.events[i]
    who = listed([f"r{u}" for u in e.uids])
    waiting = pending(run, i)
    said = f"Turn {e.turn}: launch B{e.batch}, the {e.phase} of {who}"
    said += f", before B{listed(waiting)} is processed." if waiting else "."
    dropped = [f"r{r.uid}" for r in e.reqs if r.uid in e.uids and not r.running]
    if e.phase == "prefill":
        return said + (
            f" The launch already runs complete_one: device_len is {values(e, 'device_len')} "
            f"while the host holds {values(e, 'host_len')} tokens, the prompts."
        )
    if dropped:
        return said + (
            f" Its complete_one takes device_len to {values(e, 'device_len')}, the "
            f"max_device_len, so filter_reqs drops {listed(dropped)} from the running set."
        )
    return said + (
        f" Its input tokens come from the token pool, where B{waiting[-1]} wrote them on the "
        f"device; device_len is now {values(e, 'device_len')}."
    )


def narrate_process(run: Run, i: int) -> str:
    e = run.events[i]
    launched = [b for b in pending(run, i + 1)]
    said = f"Turn {e.turn}: B{e.batch} is processed"
    said += f" while B{listed(launched)} is in flight: " if launched else ": "
    said += sent_line(e) + "."
    if e.freed:
        freed = listed([f"r{u}" for u, _ in e.freed])
        return said + f" The host has every token now, and {freed} are released at once."
    return said + (
        f" The host holds {values(e, 'host_len')} of {values(e, 'max_device_len')} tokens."
    )


def add(animation: Animation, title: str, run: Run, i: int, narration: str, rows=None) -> None:
    rows = rows_of(run, i) if rows is None else rows
    animation.add(draw(title, run, i, rows, changes(run, i) if i >= 0 else {}), narration)


def frames_of_ours(animation: Animation, ours: Run) -> None:
    add(
        animation,
        "ours: the overlap loop",
        ours,
        -1,
        f"SmolLM2 answers {listed([repr(p) for p in PROMPTS])} ("
        f"{listed([r.prompt_len for r in ours.arrived])} prompt tokens), {MAX_TOKENS} new tokens "
        f"each, with the overlap loop. The lanes will show the real run's order of events; on "
        f"this CPU each forward pass runs inside its launch, so there are no durations to show.",
    )
    for i, e in enumerate(ours.events):
        narrate = narrate_launch if e.kind == "launch" else narrate_process
        add(animation, f"ours: {e.kind} B{e.batch}", ours, i, narrate(ours, i))


def frames_of_fix1(animation: Animation, ours: Run, upstream: Run) -> None:
    """Upstream's processing against ours at the two moments where they differ."""
    same = 0
    while [(e.kind, e.batch, e.sent) for e in upstream.events[same : same + 1]] == [
        (e.kind, e.batch, e.sent) for e in ours.events[same : same + 1]
    ]:
        same += 1
    steps = listed([f"{e.kind} B{e.batch}" for e in upstream.events[:same]])
    add(
        animation,
        "upstream: the same run, upstream's processing",
        upstream,
        same - 1,
        f"The same requests with upstream's result processing mixed in (UpstreamLogic of "
        f"tests/test_ch11_overlap.py). The first {same} events are the same as ours: {steps}.",
    )
    first = upstream.events[same]
    early = [f"r{u}" for u, in_flight in first.freed if in_flight]
    add(
        animation,
        f"upstream: process B{first.batch}",
        upstream,
        same,
        f"Upstream sets finished = not can_decode, and B{pending(upstream, same + 1)[-1]}'s "
        f"launch already took device_len to max_device_len, so {sent_line(first)} while the "
        f"host holds {values(first, 'host_len')} of {values(first, 'max_device_len')} tokens. "
        + (
            f"It also frees {listed(early)} while that batch, which holds them, is in flight."
            if early
            else ""
        ),
    )
    ours_first = ours.events[same]
    flying = listed(pending(ours, same + 1))
    kept = "" if ours_first.freed else f"; nothing is freed while B{flying} is in flight"
    add(
        animation,
        f"ours at the same moment: process B{ours_first.batch}",
        ours,
        same,
        f"Ours counts on the host: finished = len(input_ids) >= max_device_len, "
        f"{values(ours_first, 'host_len')} against {values(ours_first, 'max_device_len')}, "
        f"so {sent_line(ours_first)}{kept}.",
    )
    last_up, last_ours = len(upstream.events) - 1, len(ours.events) - 1
    clients = [client_text(r[1]) for r in rows_of(upstream, last_up)]
    add(
        animation,
        f"upstream: process B{upstream.events[last_up].batch}",
        upstream,
        last_up,
        f"Then {sent_line(upstream.events[last_up])} again. A streaming client stops at the "
        f"first finished=True, so it shows {listed([repr(c) for c in clients])} and never "
        f"gets the last token.",
    )
    clients = [client_text(r[1]) for r in rows_of(ours, last_ours)]
    verdict = "each stream's only finished=True" if passes(ours) else "not each stream's only"
    add(
        animation,
        f"ours: process B{ours.events[last_ours].batch}",
        ours,
        last_ours,
        f"Ours: {sent_line(ours.events[last_ours])}, {verdict}, on its last token; the client "
        f"shows {listed([repr(c) for c in clients])}.",
    )
    both = rows_of(ours, last_ours, "ours ") + rows_of(upstream, last_up, "upstream ")
    add(
        animation,
        "ours and upstream: the two runs' streams",
        ours,
        last_ours,
        f"With ours, finished=True comes on {flag_positions(ours)}; with upstream's "
        f"processing, on {flag_positions(upstream)}. The check of test_fix1 (exactly one, on "
        f"the last message) {'passes' if passes(ours) else 'fails'} on ours and "
        f"{'passes' if passes(upstream) else 'fails'} on upstream's.",
        both,
    )


def flag_positions(run: Run) -> str:
    """Which messages of each request's stream say finished=True, e.g. 'message 3 of 3'."""
    found = {}
    for label, _, stream in rows_of(run, len(run.events)):
        at = tuple(i + 1 for i, m in enumerate(stream) if m.finished)
        found.setdefault((at, len(stream)), []).append(label)
    parts = []
    for (at, total), labels in found.items():
        which = f"message{'s' * (len(at) > 1)} {listed(at)} of {total}"
        parts.append(which if len(found) == 1 else f"{which} for {listed(labels)}")
    return "; ".join(parts)


def passes(run: Run) -> bool:
    """tests/test_ch11_overlap.py's check_streams, on the flags: one finished=True, last."""
    streams = [stream for _, _, stream in rows_of(run, len(run.events))]
    return all([m.finished for m in s].count(True) == 1 and s[-1].finished for s in streams)


def record() -> Animation:
    from minisgl.llm import LLM

    ours = run_once(LLM, "ours")
    upstream = run_once(upstream_llm(), "upstream")
    animation = Animation(NAME, "Overlap scheduling: the loop's order, and fix 1 against upstream")
    frames_of_ours(animation, ours)
    frames_of_fix1(animation, ours, upstream)
    return animation
