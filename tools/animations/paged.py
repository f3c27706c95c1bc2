"""Paged attention (chapters 04 and 05), recorded from a real run of ``LLM.generate``.

Tiny Qwen3 serves four requests of different lengths with pages of 4 token slots, three
request slots and a pool of 10 pages, so that pages are taken as tokens arrive, given back
when a request ends and handed out again. The recorder wraps the cache manager's
``allocate_paged``, the pool's ``store_kv``, the attention backend's ``forward`` (layer 0) and
the scheduler's release of a request, and draws the real state after each: the page table's
rows, the pool's pages and their owners, the slots a batch writes (``out_loc``) and the slots
one request's keys are gathered from (``kv_slots``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from tools.animations import Animation
from tools.figures.svg import BLUE, GREEN, ORANGE, PURPLE, Svg

if TYPE_CHECKING:
    from minisgl.core import Batch, Req
    from minisgl.llm import LLM

NAME = "paged-attention"
SOURCES = [
    "tools/animations/paged.py",
    "tools/animations/__init__.py",
    "minisgl/kvcache/mha_pool.py",
    "minisgl/attention/native.py",
    "minisgl/scheduler/cache.py",
    "minisgl/scheduler/table.py",
]
MODEL = "tiny-qwen3"
PROMPTS = [
    [9, 120, 3001, 4, 5, 6],
    [77, 15, 16],
    [400, 401, 402, 403, 404, 405, 406, 407, 408],
    [7, 8, 9, 10, 11],
]
MAX_TOKENS = [6, 3, 5, 3]
PAGE_SIZE = 4
NUM_PAGES = 10  # small enough that the fourth request gets pages the first ones gave back
REQUEST_SLOTS = 3  # the fourth request waits for a row of the page table
COLUMNS = 16  # positions drawn per row: the longest request's pages
OWNER_COLOURS = [BLUE, ORANGE, GREEN, PURPLE]
WIDTH, HEIGHT = 940, 400
CELL_X, CELL_W, CELL_H = 112, 30, 24  # page-table and strip cells
ROW_Y, ROW_H = 80, 30
STRIP_Y = 178
POOL_Y, PAGE_W, SLOT_H = 262, 84, 22
PANEL_X = 628


@dataclass(frozen=True)
class Row:
    index: int  # the request slot: the row of the page table
    uid: Optional[int]  # the request holding it, None when free
    slots: List[int]  # its entries for the pages it holds
    length: int  # device_len: positions whose K/V are written or being written


@dataclass(frozen=True)
class State:
    rows: List[Row]
    owners: Dict[int, int]  # page -> uid of the request whose row holds it
    free: List[int]  # the free list, in order, as pages
    written: FrozenSet[int]  # token slots holding a live request's K/V


@dataclass(frozen=True)
class Strip:
    """A row of token slots under the page table, each with an arrow into the pool."""

    label: str
    slots: List[int]
    uids: List[Optional[int]]  # whose entry each one is; None for padding
    per_page: bool  # one arrow per page (a gather) or one per slot (a store)


@dataclass
class Marks:
    cells: Set[Tuple[int, int]] = field(default_factory=set)  # (row, position) touched
    slots: Set[int] = field(default_factory=set)  # pool slots touched
    new_pages: Set[int] = field(default_factory=set)
    strip: Optional[Strip] = None


def name(uid: Optional[int]) -> str:
    return "free" if uid is None else f"r{uid}"


def colour(uid: Optional[int]) -> Optional[str]:
    return None if uid is None else OWNER_COLOURS[uid % len(OWNER_COLOURS)]


def spans(values: Sequence[int]) -> str:
    """[0, 1, 2, 3, 8, 9] -> '0-3, 8-9': runs of consecutive numbers."""
    runs: List[List[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def listed(items: Sequence[object]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def held_len(length: int) -> int:
    """Positions covered by the pages a request of `length` tokens holds."""
    return -(-length // PAGE_SIZE) * PAGE_SIZE


def page_runs(slots: Sequence[int]) -> List[Tuple[int, int, int]]:
    """(first position, last position, page) for each run of positions in one page."""
    runs: List[Tuple[int, int, int]] = []
    for pos, slot in enumerate(slots):
        page = slot // PAGE_SIZE
        if runs and runs[-1][2] == page:
            runs[-1] = (runs[-1][0], pos, page)
        else:
            runs.append((pos, pos, page))
    return runs


# --------------------------------------------------------------------------------- drawing
def cell_x(pos: int) -> float:
    return CELL_X + pos * CELL_W


def page_x(page: int) -> float:
    gap = (WIDTH - 40 - NUM_PAGES * PAGE_W) / (NUM_PAGES - 1)
    return 20 + page * (PAGE_W + gap)


def slot_x(slot: int) -> float:
    """Left edge of a token slot's cell inside its page."""
    return page_x(slot // PAGE_SIZE) + 4 + (slot % PAGE_SIZE) * (PAGE_W - 8) / PAGE_SIZE


def draw_table(s: Svg, state: State, marks: Marks) -> None:
    s.text(
        20,
        52,
        "page table: one row per request slot, one column per position; each entry is a token "
        f"slot (page × {PAGE_SIZE} + offset)",
        size=12,
        muted=True,
    )
    for pos in range(COLUMNS):
        s.text(cell_x(pos) + CELL_W / 2, 72, str(pos), size=12, anchor="middle", muted=True)
    s.text(CELL_X - 8, 72, "position", size=12, anchor="end", muted=True)
    for row in state.rows:
        y = ROW_Y + row.index * ROW_H
        s.text(
            20,
            y + 17,
            f"row {row.index} · {name(row.uid)}",
            size=12,
            bold=row.uid is not None,
            muted=row.uid is None,
        )
        for pos in range(COLUMNS):
            x = cell_x(pos)
            if pos >= len(row.slots):
                s.box(x + 1, y, CELL_W - 2, CELL_H, None, rx=3, stroke_width=0.6)
                continue
            stored = pos < row.length and row.slots[pos] in state.written
            s.box(
                x + 1,
                y,
                CELL_W - 2,
                CELL_H,
                colour(row.uid),
                rx=3,
                fill_opacity=0.42 if stored else 0.1,
                stroke_width=1,
            )
            if (row.index, pos) in marks.cells:
                s.box(x + 1, y, CELL_W - 2, CELL_H, None, rx=3, stroke_width=2.4)
            s.text(
                x + CELL_W / 2,
                y + 16.5,
                str(row.slots[pos]),
                size=12,
                anchor="middle",
                muted=not stored,
            )


def draw_strip(s: Svg, strip: Strip, state: State) -> None:
    s.text(CELL_X - 8, STRIP_Y + 17, strip.label, size=12, anchor="end", bold=True, mono=True)
    for i, (slot, uid) in enumerate(zip(strip.slots, strip.uids)):
        x = cell_x(i)
        s.box(
            x + 1,
            STRIP_Y,
            CELL_W - 2,
            CELL_H,
            colour(uid),
            rx=3,
            dashed=uid is None,
            fill_opacity=0.42,
            stroke_width=1,
        )
        s.text(
            x + CELL_W / 2, STRIP_Y + 16.5, str(slot), size=12, anchor="middle", muted=uid is None
        )
    top, bottom = STRIP_Y + CELL_H + 2, POOL_Y - 2
    if strip.per_page:
        valid = [slot for slot, uid in zip(strip.slots, strip.uids) if uid is not None]
        arrows = [
            ((cell_x(a) + cell_x(b + 1)) / 2, page_x(p) + PAGE_W / 2, strip.uids[a])
            for a, b, p in page_runs(valid)
        ]
    else:
        arrows = [
            (cell_x(i) + CELL_W / 2, slot_x(slot) + (PAGE_W - 8) / PAGE_SIZE / 2, uid)
            for i, (slot, uid) in enumerate(zip(strip.slots, strip.uids))
        ]
    mid = (top + bottom) / 2
    for x1, x2, uid in arrows:
        s.path(
            f"M{x1:.1f},{top} C{x1:.1f},{mid} {x2:.1f},{mid} {x2:.1f},{bottom}",
            color=colour(uid),
            width=1.4,
            opacity=0.8,
        )


def draw_pool(s: Svg, state: State, marks: Marks) -> None:
    slot_w = (PAGE_W - 8) / PAGE_SIZE
    for page in range(NUM_PAGES):
        x, uid = page_x(page), state.owners.get(page)
        s.box(
            x,
            POOL_Y,
            PAGE_W,
            SLOT_H + 8,
            colour(uid),
            rx=6,
            fill_opacity=0.08,
            stroke_width=2 if page in marks.new_pages else 1.2,
            dashed=uid is None,
        )
        for offset in range(PAGE_SIZE):
            slot = page * PAGE_SIZE + offset
            sx = x + 4 + offset * slot_w
            stored = uid is not None and slot in state.written
            if uid is not None:
                s.box(
                    sx + 1,
                    POOL_Y + 4,
                    slot_w - 2,
                    SLOT_H,
                    colour(uid),
                    rx=2,
                    fill_opacity=0.42 if stored else 0.1,
                    stroke_width=0.6,
                )
            if slot in marks.slots:
                s.box(sx + 1, POOL_Y + 4, slot_w - 2, SLOT_H, None, rx=2, stroke_width=2.2)
            s.text(
                sx + slot_w / 2,
                POOL_Y + 19.5,
                str(slot),
                size=12,
                anchor="middle",
                muted=not stored,
            )
        s.text(x + PAGE_W / 2, POOL_Y + 48, f"page {page}", size=12, anchor="middle")
        owner = name(uid) + (", new" if page in marks.new_pages else "")
        s.text(
            x + PAGE_W / 2,
            POOL_Y + 64,
            owner,
            size=12,
            anchor="middle",
            bold=page in marks.new_pages,
            muted=uid is None,
        )
    s.text(
        20,
        POOL_Y + 92,
        f"KV pool, layer 0 (every layer uses the same slots) · free list, "
        f"in order: {', '.join(f'page {p}' for p in state.free) or 'empty'}",
        size=13,
    )


def draw_legend(s: Svg) -> None:
    y = HEIGHT - 14
    x = 20.0
    for label, opacity, outline in [
        ("K/V stored", 0.42, False),
        ("in a taken page, not yet written", 0.1, False),
        ("read or written in this step", 0.1, True),
    ]:
        s.box(x, y - 11, 14, 14, BLUE, rx=3, fill_opacity=opacity, stroke_width=1)
        if outline:
            s.box(x, y - 11, 14, 14, None, rx=3, stroke_width=2.2)
        s.text(x + 20, y, label, size=12, muted=True)
        x += 40 + len(label) * 6.4
    s.box(x, y - 11, 14, 14, None, rx=3, dashed=True, stroke_width=1)
    s.text(x + 20, y, "free page, or padding", size=12, muted=True)


def draw(state: State, title: str, panel: List[str], marks: Marks) -> str:
    s = Svg("anim-paged", WIDTH, HEIGHT, "Paged attention", title)
    s.text(20, 28, title, size=15, bold=True)
    draw_table(s, state, marks)
    if panel:
        s.text(PANEL_X, ROW_Y + 12, panel[0], size=13, bold=True)
        s.lines(PANEL_X, ROW_Y + 32, panel[1:], size=12, gap=1.4)
    if marks.strip is not None:
        draw_strip(s, marks.strip, state)
    draw_pool(s, state, marks)
    draw_legend(s)
    return s.render()


# -------------------------------------------------------------------------------- recording
class PagedRecorder:
    """Wraps the real methods and turns each event into frames."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.animation = Animation(NAME, "Paged attention: the page table, store_kv, the gather")
        self.live: Dict[int, Req] = {}  # by uid, from its first pages to its release
        # uid -> its device_len when its pages were last allocated: a launch advances
        # device_len before the next batch allocates the page for it
        self.allocated: Dict[int, int] = {}
        self.written: Set[int] = set()
        self.batches = 0
        self.new_pages: Dict[int, List[int]] = {}  # uid -> pages the current batch gave it
        self.released: List[Tuple[int, int, List[int]]] = []  # (uid, row, pages)
        self.stored: Tuple[List[int], bool] = ([], False)  # out_loc of layer 0, pool == k

    def state(self) -> State:
        table = self.llm.engine.page_table
        by_row = {req.table_idx: req for req in self.live.values()}
        rows, owners = [], {}
        for index in range(REQUEST_SLOTS):
            req = by_row.get(index)
            if req is None:
                rows.append(Row(index, None, [], 0))
                continue
            length = self.allocated[req.uid]
            slots = table[index, : held_len(length)].tolist()
            rows.append(Row(index, req.uid, slots, length))
            owners.update({slot // PAGE_SIZE: req.uid for slot in slots[::PAGE_SIZE]})
        free = (self.llm.cache_manager.free_slots // PAGE_SIZE).tolist()
        return State(rows, owners, free, frozenset(self.written))

    def frame(self, title: str, panel: List[str], marks: Marks, narration: str) -> None:
        self.animation.add(draw(self.state(), title, panel, marks), narration)

    def install(self) -> None:
        manager, engine = self.llm.cache_manager, self.llm.engine
        allocate, store = manager.allocate_paged, engine.kv_cache.store_kv
        forward = engine.attn_backend.forward
        free, process = self.llm._free_req_resources, self.llm._process_last_data

        def allocate_paged(reqs) -> None:
            before = self.state().owners
            allocate(reqs)
            fresh = [r for r in reqs if r.uid not in self.live]
            self.live.update({r.uid: r for r in reqs})
            self.allocated.update({r.uid: r.device_len for r in reqs})
            self.new_pages = {}
            for row in self.state().rows:  # in position order
                for page in [slot // PAGE_SIZE for slot in row.slots[::PAGE_SIZE]]:
                    if before.get(page) != row.uid:
                        self.new_pages.setdefault(row.uid, []).append(page)
            if fresh:
                self.admitted(fresh)

        def store_kv(k, v, out_loc, layer_id: int) -> None:
            store(k, v, out_loc, layer_id)
            if layer_id == 0:
                pool = engine.kv_cache.k_cache(0).view(-1, *k.shape[1:])
                self.stored = (out_loc.tolist(), bool((pool[out_loc.long()] == k).all()))

        def attn_forward(q, k, v, layer_id: int, batch):
            out = forward(q, k, v, layer_id, batch)
            if layer_id == 0:
                self.batches += 1
                self.after_store(batch)
                self.after_gather(batch)
            return out

        def free_req_resources(req) -> None:
            held = held_len(self.allocated.pop(req.uid))
            slots = engine.page_table[req.table_idx, :held].tolist()
            free(req)
            self.released.append(
                (req.uid, req.table_idx, [s // PAGE_SIZE for s in slots[::PAGE_SIZE]])
            )
            self.live.pop(req.uid)
            self.written -= set(slots)

        def process_last_data(last_data) -> None:
            process(last_data)  # the pages it frees reach the free list at its end
            if self.released:
                self.after_release()

        manager.allocate_paged = allocate_paged  # type: ignore[method-assign]
        engine.kv_cache.store_kv = store_kv  # type: ignore[method-assign]
        engine.attn_backend.forward = attn_forward  # type: ignore[method-assign]
        self.llm._free_req_resources = free_req_resources  # type: ignore[method-assign]
        self.llm._process_last_data = process_last_data  # type: ignore[method-assign]

    # ------------------------------------------------------------------------------ frames
    def intro(self) -> None:
        lens = [len(p) for p in PROMPTS]
        shape = list(self.llm.engine.kv_cache.k_cache(0).shape)
        panel = ["the requests"] + [
            f"r{uid}: {n} prompt tokens, up to {m} new"
            for uid, (n, m) in enumerate(zip(lens, MAX_TOKENS))
        ]
        self.frame(
            "an empty pool",
            panel,
            Marks(),
            f"Tiny Qwen3 with {NUM_PAGES} pages of {PAGE_SIZE} token slots and {REQUEST_SLOTS} "
            f"request slots; a layer's keys are a tensor {shape}, whose extra page is the dummy's. "
            f"{len(PROMPTS)} requests of {listed(lens)} prompt tokens arrive; every page is free.",
        )

    def admitted(self, reqs: List[Req]) -> None:
        panel = ["allocate_paged"]
        said = []
        cells = set()
        for req in reqs:
            pages = self.new_pages.get(req.uid, [])
            panel.append(f"r{req.uid}: row {req.table_idx}, pages {', '.join(map(str, pages))}")
            said.append(
                f"r{req.uid} row {req.table_idx} with page{'s' * (len(pages) > 1)} {listed(pages)}"
            )
            cells |= {(req.table_idx, p) for p in range(held_len(req.device_len))}
        partial = [f"r{r.uid}" for r in reqs if r.device_len % PAGE_SIZE]
        tail = f" The last page of {listed(partial)} is only partly used." if partial else ""
        scattered = [
            r
            for r in reqs
            if len(self.new_pages.get(r.uid, [])) > 1 and _not_neighbours(self.new_pages[r.uid])
        ]
        if scattered:
            tail = (
                f" r{scattered[0].uid}'s pages are not neighbours, yet its row lists its "
                f"slots in position order."
            )
        self.frame(
            f"prefill of {listed([f'r{r.uid}' for r in reqs])}: allocate_paged",
            panel,
            Marks(cells=cells, new_pages={p for r in reqs for p in self.new_pages.get(r.uid, [])}),
            f"allocate_paged gives {listed(said)}, and writes each page's slots into the "
            f"row, one entry per position.{tail}",
        )

    def after_store(self, batch: Batch) -> None:
        out_loc, equal = self.stored
        self.written |= set(out_loc)
        uids: List[Optional[int]] = []
        cells = set()
        for req in batch.reqs:
            uids += [req.uid] * req.extend_len
            cells |= {(req.table_idx, p) for p in range(req.cached_len, req.device_len)}
        phase = "prefill" if batch.is_prefill else "decode"
        grew = [(uid, pages) for uid, pages in self.new_pages.items() if uid in self.live]
        who = listed([f"r{r.uid}" for r in batch.reqs])
        if batch.is_prefill:
            said = f"A prefill step for {who}, {len(out_loc)} new tokens. "
        else:
            each = " each" if len(batch.reqs) > 1 else ""
            said = f"A decode step for {who}, one new token{each}"
            if grew:
                said += "; " + "; ".join(
                    f"r{uid} starts a page, so allocate_paged gave it page {listed(pages)}"
                    for uid, pages in grew
                )
            said += ". "
        said += (
            f"store_kv writes their keys and values at out_loc = [{spans(out_loc)}], and "
            f"the pool read back there equals k exactly: {equal}."
        )
        panel = [
            f"batch {self.batches}: {phase} of {', '.join(f'r{r.uid}' for r in batch.reqs)}",
            f"positions: {spans(batch.positions.tolist())}",
            f"out_loc: {spans(out_loc)}",
            f"pool[out_loc] == k: {equal}",
        ]
        marks = Marks(
            cells,
            set(out_loc),
            set() if batch.is_prefill else {p for _, pages in grew for p in pages},
            Strip("out_loc", out_loc, uids, per_page=False),
        )
        self.frame(f"batch {self.batches} ({phase}): store_kv", panel, marks, said)
        self.new_pages = {}

    def after_gather(self, batch: Batch) -> None:
        meta = batch.attn_metadata
        b = (self.batches - 1) % len(batch.reqs)
        req = batch.reqs[b]
        slots = meta.kv_slots[b].tolist()
        valid = meta.kv_valid[b].tolist()
        k_all = self.llm.engine.kv_cache.k_cache(0)
        shape = list(k_all.view(-1, *k_all.shape[2:])[meta.kv_slots].shape)
        uids = [req.uid if ok else None for ok in valid]
        runs = page_runs([s for s, ok in zip(slots, valid) if ok])
        where = ", ".join(
            f"{a}-{z} from page {p}" if a != z else f"{a} from page {p}" for a, z, p in runs
        )
        pad = [i for i, ok in enumerate(valid) if not ok]
        said = (
            f"For r{req.uid}, the backend reads kv_slots, the first {len(slots)} entries "
            f"of row {req.table_idx}: positions {where}."
        )
        if pad:
            owners = self.state().owners
            pad_slots = list(dict.fromkeys(slots[i] for i in pad))
            others = sorted(
                {name(owners.get(slot // PAGE_SIZE)) for slot in pad_slots}
                - {name(None), name(req.uid)}
            )
            held = f"slot{'s' * (len(pad_slots) > 1)} {listed(pad_slots)}"
            if others:
                held += f", in {listed(others)}'s pages"
            said += (
                f" Positions {spans(pad)} only pad it to the batch's longest request: kv_valid "
                f"is False there, so what the row holds ({held}) is zeroed."
            )
        else:
            said += f" k_all[kv_slots] gathers the whole batch's keys at once: {shape}."
        panel = [
            f"gather for r{req.uid} (layer 0)",
            f"kv_slots[{b}] = row {req.table_idx}[:{len(slots)}]",
            f"valid: {sum(valid)}, padding: {len(pad) or 'none'}",
            f"k_all[kv_slots]: {shape}",
        ]
        cells = {(req.table_idx, p) for p in range(req.device_len)}
        gathered = {s for s, ok in zip(slots, valid) if ok}
        marks = Marks(cells, gathered, set(), Strip(f"kv_slots[{b}]", slots, uids, True))
        self.frame(f"batch {self.batches}: attention gathers r{req.uid}'s K/V", panel, marks, said)

    def after_release(self) -> None:
        free = self.state().free
        panel = ["released"] + [
            f"r{uid}: row {row}, pages {', '.join(map(str, pages))}"
            for uid, row, pages in self.released
        ]
        said = "; ".join(
            f"r{uid} is done: row {row} and page{'s' * (len(pages) > 1)} {listed(pages)} "
            f"are given back"
            for uid, row, pages in self.released
        )
        who = listed([f"r{uid}" for uid, _, _ in self.released])
        self.frame(
            f"{who} released",
            panel,
            Marks(),
            f"{said}. Freed pages join the end of the free list, now pages {listed(free)}."
            if free
            else f"{said}.",
        )
        self.released = []


def _not_neighbours(pages: Sequence[int]) -> bool:
    return any(b != a + 1 for a, b in zip(pages, pages[1:]))


def record() -> Animation:
    import torch

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM
    from tools.models import ensure_model

    llm = LLM(
        str(ensure_model(MODEL)),
        dtype=torch.float32,
        max_running_req=REQUEST_SLOTS,
        page_size=PAGE_SIZE,
        num_page_override=NUM_PAGES,
        cache_type="naive",  # a finished request's pages go back to the free list
    )
    recorder = PagedRecorder(llm)
    try:
        recorder.intro()
        recorder.install()
        llm.generate(PROMPTS, [SamplingParams(max_tokens=n) for n in MAX_TOKENS])
        llm.cache_manager.check_integrity()
    finally:
        llm.shutdown()
    return recorder.animation
