"""Tensor parallelism (chapter 16): one forward step of tiny Qwen3 on two ranks, recorded from a
real run.

Two processes, rank 0 and rank 1, each build an engine for their rank as the scheduler does
(``set_tp_info(rank, 2)``, the model on the meta device, its slice of the checkpoint from
``load_weight``), joined in one gloo process group, and run the same prefill of a short prompt.
Each rank wraps the ``forward`` of a few of its ops (the embedding, layer 0's norms and
projections, attention, the final norm, the LM head) and the communicator's ``all_reduce`` and
``all_gather``, and records their real inputs and outputs; it sends them to the recorder over a
multiprocessing queue. Rank 0 then runs the whole model on one rank, whose outputs the frames
compare with the ranks' (at the column splits, the all-reduces and the sampled token). Each
frame draws one step on two lanes, rank 0 above and rank 1 below, with that step's real shapes
and numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple, Union

from tools.animations import Animation
from tools.figures.svg import BLUE, GREY, ORANGE, PURPLE, Svg, text_width

if TYPE_CHECKING:
    import multiprocessing as mp

NAME = "tensor-parallel"
SOURCES = [
    "tools/animations/tp.py",
    "tools/animations/__init__.py",
    "minisgl/layers/linear.py",
    "minisgl/layers/embedding.py",
    "minisgl/layers/attention.py",
    "minisgl/layers/norm.py",
    "minisgl/distributed/impl.py",
    "minisgl/distributed/info.py",
    "minisgl/models/weight.py",
    "minisgl/models/utils.py",
    "minisgl/engine/engine.py",
    "minisgl/engine/sample.py",
    "minisgl/kvcache/mha_pool.py",
    "minisgl/attention/native.py",
    "examples/helpers/paging.py",
]
MODEL = "tiny-qwen3"
TEXT = "Tensor parallelism splits matrices"  # tokens from both halves of the vocabulary
RANKS = 2
TIMEOUT_S = 120.0
SHOWN = 3  # values shown of a hidden state
RANK_COLORS = (BLUE, ORANGE)  # as in the figures of chapter 16
COLLECTIVE = PURPLE
WIDTH, HEIGHT = 940, 460
LANE_X0, LANE_RIGHT = 72, 928  # the lanes' first step, their end
LANE_TOP = (66, 114)  # the lanes' chip tops
CHIP_H = 26
PANEL_Y, PANEL_H = 158, 152
TABLE_Y = 338


# ------------------------------------------------------------------------- in each rank
def _array(t: Any) -> Any:
    return t.detach().to("cpu").float().numpy().copy()


class _Tap:
    """Wraps ops of one rank's model and its communicator; records what goes in and out."""

    def __init__(self) -> None:
        self.events: List[Dict[str, Any]] = []
        self.inside: List[Tuple[str, Optional[int]]] = []  # the ops running now, outermost first

    def op(self, owner: Any, attr: str, name: str, layer: Optional[int] = None) -> None:
        forward = getattr(owner, attr)

        def wrapped(*args: Any) -> Any:
            self.inside.append((name, layer))
            x = args[0].tolist() if name == "embed_tokens" else _array(args[0])
            try:
                y = forward(*args)
            finally:
                self.inside.pop()
            first = y[0] if isinstance(y, tuple) else y  # a fused norm: (normed, residual)
            self.events.append({"op": name, "layer": layer, "x": x, "y": _array(first)})
            return y

        setattr(owner, attr, wrapped)

    def communicator(self) -> None:
        from minisgl.distributed import DistributedCommunicator

        reduce, gather = DistributedCommunicator.all_reduce, DistributedCommunicator.all_gather

        def all_reduce(comm: Any, x: Any) -> Any:
            before = _array(x)  # all_reduce works in place
            y = reduce(comm, x)
            self.events.append(
                {"op": "all_reduce", "by": self.inside[-1], "x": before, "y": _array(y)}
            )
            return y

        def all_gather(comm: Any, x: Any) -> Any:
            before = _array(x)
            y = gather(comm, x)
            self.events.append(
                {"op": "all_gather", "by": self.inside[-1], "x": before, "y": _array(y)}
            )
            return y

        DistributedCommunicator.all_reduce = all_reduce  # type: ignore[method-assign]
        DistributedCommunicator.all_gather = all_gather  # type: ignore[method-assign]


def _prefill(engine: Any, prompt: List[int]) -> int:
    """One prefill step of one request, prepared by hand as in chapter 06: its next token."""
    import torch

    from examples.helpers.paging import PageAllocator, prepare_batch
    from minisgl.core import Req, SamplingParams

    allocator = PageAllocator(engine.num_pages, engine.ctx.page_size, engine.page_table)
    req = Req(
        input_ids=torch.tensor(prompt, dtype=torch.int32),
        table_idx=0,
        cached_len=0,
        output_len=1,
        uid=0,
        sampling_params=SamplingParams(max_tokens=1),
        cache_handle=None,  # type: ignore[arg-type]
    )
    batch = prepare_batch([req], "prefill", allocator)
    engine.attn_backend.prepare_metadata(batch)
    output = engine.forward_batch(batch, engine.sampler.prepare(batch))
    output.copy_done_event.synchronize()
    return int(output.next_tokens_cpu[0])


def _holdings(engine: Any) -> Dict[str, Any]:
    state = engine.model.state_dict()
    attn = engine.model.model.layers.op_list[0].self_attn.attn
    return {
        "shapes": {k: tuple(v.shape) for k, v in state.items()},
        "params": sum(v.numel() for v in state.values()),
        "k_cache": tuple(engine.kv_cache.k_cache(0).shape),
        "heads": (attn.num_qo_heads, attn.num_kv_heads, attn.head_dim),  # this rank's
    }


def _rank(config: Any, prompt: List[int], out: mp.Queue, done: Any) -> None:
    """One rank: its engine, the prefill with the taps on, its records on `out`; rank 0 then
    runs the whole model on one rank. Waits for `done` (every record received) to exit."""
    os.environ["MINISGL_DEVICE"] = "cpu"  # gloo, on the CPU, whatever the machine has
    import logging

    from minisgl.distributed import DistributedInfo
    from minisgl.engine import Engine
    from minisgl.utils import make_stoppable

    make_stoppable()
    for name in list(logging.Logger.manager.loggerDict):
        if name.startswith("minisgl"):
            logging.getLogger(name).setLevel(logging.WARNING)
    rank = config.tp_info.rank
    tap = _Tap()
    tap.communicator()
    engine = Engine(config)
    try:
        model = engine.model.model
        layers = model.layers.op_list
        tap.op(model.embed_tokens, "forward", "embed_tokens")
        first = layers[0]
        tap.op(first.input_layernorm, "forward", "input_layernorm", 0)
        tap.op(first.self_attn.qkv_proj, "forward", "qkv_proj", 0)
        tap.op(first.self_attn.attn, "forward", "attn", 0)
        tap.op(first.post_attention_layernorm, "forward", "post_attention_layernorm", 0)
        tap.op(first.mlp.gate_up_proj, "forward", "gate_up_proj", 0)
        tap.op(first.mlp, "act_fn", "act_fn", 0)
        for i, layer in enumerate(layers):
            tap.op(layer.self_attn.o_proj, "forward", "o_proj", i)
            tap.op(layer.mlp.down_proj, "forward", "down_proj", i)
        tap.op(model.norm, "forward", "norm")
        tap.op(engine.model.lm_head, "forward", "lm_head")
        record = {
            "rank": rank,
            "pid": os.getpid(),
            "vocab_range": tuple(model.embed_tokens.vocab_range),
            "num_layers": len(layers),
            **_holdings(engine),
        }
        record["next_token"] = _prefill(engine, prompt)
        record["events"] = tap.events
    finally:
        engine.shutdown()
    if rank == 0:  # the whole model on one rank, for comparison
        whole = Engine(replace(config, tp_info=DistributedInfo(0, 1)))
        try:
            tap = _Tap()
            first = whole.model.model.layers.op_list[0]
            tap.op(whole.model.model.embed_tokens, "forward", "embed_tokens")
            tap.op(first.self_attn.qkv_proj, "forward", "qkv_proj", 0)
            tap.op(first.self_attn.o_proj, "forward", "o_proj", 0)
            tap.op(first.mlp.gate_up_proj, "forward", "gate_up_proj", 0)
            tap.op(first.mlp.down_proj, "forward", "down_proj", 0)
            tap.op(whole.model.lm_head, "forward", "lm_head")
            record["whole"] = {**_holdings(whole), "next_token": _prefill(whole, prompt)}
            record["whole"]["events"] = tap.events
        finally:
            whole.shutdown()
    out.put((rank, record))
    done.wait(TIMEOUT_S)


# ------------------------------------------------------------------------------- drawing
@dataclass(frozen=True)
class Step:
    key: str
    label: str
    kind: str  # "op", "reduce", "gather", "more"
    split: bool = True  # False: the same weights and result on both ranks (grey)


STEPS = [
    Step("embed", "embed", "op"),
    Step("ar_embed", "", "reduce"),
    Step("norm_in", "norm", "op", False),
    Step("qkv", "qkv_proj", "op"),
    Step("attn", "attn", "op"),
    Step("o_proj", "o_proj", "op"),
    Step("ar_o", "", "reduce"),
    Step("norm_post", "norm", "op", False),
    Step("gate_up", "gate_up", "op"),
    Step("silu", "SiLU", "op"),
    Step("down", "down", "op"),
    Step("ar_down", "", "reduce"),
    Step("more", "layers 1-2", "more"),
    Step("norm", "norm", "op", False),
    Step("lm_head", "lm_head", "op"),
    Step("gather", "", "gather"),
    Step("argmax", "argmax", "op", False),
]
KEYS = [s.key for s in STEPS]
HELD = [  # the weights the first frame shows, rank's and whole
    ("embed_tokens", "model.embed_tokens.weight"),
    ("qkv_proj", "model.layers.0.self_attn.qkv_proj.weight"),
    ("o_proj", "model.layers.0.self_attn.o_proj.weight"),
    ("gate_up_proj", "model.layers.0.mlp.gate_up_proj.weight"),
    ("down_proj", "model.layers.0.mlp.down_proj.weight"),
]
BRACKETS = [  # a label over a run of steps
    ("embedding", "embed", "ar_embed"),
    ("layer 0: attention", "norm_in", "ar_o"),
    ("layer 0: MLP", "norm_post", "ar_down"),
    ("LM head", "norm", "argmax"),
]
NODE_W = 24  # a collective's node


def step_width(step: Step) -> float:
    if step.kind in ("reduce", "gather"):
        return NODE_W
    return text_width(step.label, 12) + 12


def step_xs() -> List[float]:
    widths = [step_width(s) for s in STEPS]
    gap = (LANE_RIGHT - LANE_X0 - sum(widths)) / (len(STEPS) - 1)
    return [LANE_X0 + sum(widths[:i]) + gap * i for i in range(len(STEPS))]


@dataclass(frozen=True)
class Cells:
    """A row of token ids in a panel, filled where this rank holds the token."""

    ids: List[int]
    mine: List[bool]
    color: str


Line = Union[str, Cells]


@dataclass
class Table:
    """Rows of numbers under the panels; a rule before row `rule` (a sum)."""

    title: str
    header: List[str]
    rows: List[Tuple[str, Optional[str], List[str]]]  # (label, colour, cells)
    groups: List[Tuple[str, int]] = field(default_factory=list)  # (label, columns) above
    rule: Optional[int] = None
    label_w: float = 200


@dataclass
class Bar:
    """One dimension of a whole tensor, cut into the ranks' parts; ticks mark single indices."""

    title: str
    total: int
    segments: List[Tuple[int, int, int, str]]  # (start, end, rank, label)
    ticks: List[Tuple[int, str, int]] = field(default_factory=list)  # (index, label, rank)


def draw_bar(s: Svg, bar: Bar) -> None:
    """Labels inside the segments; with ticks, the ticks' labels are inside and the segments'
    under the bar."""
    x0, w, y, h = 20, 900, TABLE_Y + 12, 24
    s.text(x0, TABLE_Y, bar.title, size=13, bold=True)

    def at(i: float) -> float:
        return x0 + w * i / bar.total

    for start, end, rank, label in bar.segments:
        left, right = at(start), at(end)
        s.box(left, y, right - left, h, RANK_COLORS[rank], rx=3, fill_opacity=0.25, stroke_width=1)
        if bar.ticks:
            s.text(left + 2, y + h + 18, label, size=12, color=RANK_COLORS[rank])
        else:
            s.text((left + right) / 2, y + 16.5, label, size=12, anchor="middle")
    for index, label, rank in bar.ticks:
        x = at(index + 0.5)
        s.line(x, y - 3, x, y + h + 3, width=2.4, color=RANK_COLORS[rank])
        reach = x + 6 + text_width(label, 12, mono=True)  # its label's end, drawn on the right
        right = any(x < at(end) < reach for _, end, _, _ in bar.segments)  # it would cross an end
        s.text(x - 4 if right else x + 4, y + 16.5, label, size=12, mono=True, bold=True,
               anchor="end" if right else "start")  # fmt: skip


def draw_lanes(s: Svg, now: Set[str], last: int) -> None:
    xs = step_xs()
    mid = [t + CHIP_H / 2 for t in LANE_TOP]
    for label, a, b in BRACKETS:
        x1 = xs[KEYS.index(a)]
        x2 = xs[KEYS.index(b)] + step_width(STEPS[KEYS.index(b)])
        s.path(f"M{x1},{60} L{x1},{55} L{x2},{55} L{x2},{60}", width=1, arrow_end=False)
        s.text((x1 + x2) / 2, 49, label, size=12, anchor="middle", muted=True)
    for r in (0, 1):
        s.pill(8, mid[r], f"rank {r}", RANK_COLORS[r], size=12.5)
        s.line(LANE_X0 - 6, mid[r], LANE_RIGHT, mid[r], width=1.2, opacity=0.5)
    for i, (step, x) in enumerate(zip(STEPS, xs)):
        w = step_width(step)
        cx = x + w / 2
        state = "now" if step.key in now else "done" if i <= last else "todo"
        fill = {"now": 0.45, "done": 0.2, "todo": 0.05}[state]
        stroke = 2.6 if state == "now" else 1.2
        if step.kind in ("reduce", "gather"):
            d = 13
            s.path(
                f"M{cx},{mid[0] + d} L{cx},{mid[1] - d}",
                color=COLLECTIVE,
                width=2.6 if state == "now" else 1.6,
                arrow_start=True,
                opacity=1 if state != "todo" else 0.4,
            )
            label = "all-reduce" if step.kind == "reduce" else "all-gather"
            if state == "now":
                s.label_bg(
                    cx, (mid[0] + mid[1]) / 2 + 4.5, label, size=12, bold=True, color=COLLECTIVE
                )
            for r in (0, 1):
                if step.kind == "gather":
                    for k in (0, 1):
                        s.box(
                            cx - 12 + 12 * k, mid[r] - 9, 12, 18, RANK_COLORS[k], rx=2,
                            fill_opacity=fill + 0.1, stroke_width=stroke, solid_bg=True,
                        )  # fmt: skip
                else:
                    s.box(
                        cx - 12, mid[r] - 12, 24, 24, COLLECTIVE, rx=12, fill_opacity=fill,
                        stroke_width=stroke, solid_bg=True,
                    )  # fmt: skip
                    s.text(
                        cx, mid[r] + 5, "+", size=15, anchor="middle", bold=True, color=COLLECTIVE
                    )
            continue
        for r in (0, 1):
            color = RANK_COLORS[r] if step.split else GREY
            top = LANE_TOP[r]
            if step.kind == "more":
                s.box(
                    x, top, w, CHIP_H, None, rx=6, dashed=True, stroke_width=stroke, solid_bg=True
                )
                if state != "todo":
                    s.box(x, top, w, CHIP_H, color, rx=6, fill_opacity=fill, stroke_width=0)
            else:
                s.box(
                    x,
                    top,
                    w,
                    CHIP_H,
                    color,
                    rx=6,
                    fill_opacity=fill,
                    stroke_width=stroke,
                    solid_bg=True,
                )
            s.text(cx, top + 17.5, step.label, size=12, anchor="middle", bold=state == "now",
                   muted=state == "todo")  # fmt: skip


def draw_panel(s: Svg, rank: int, title: str, lines: Sequence[Line]) -> None:
    x, w = (20, 440) if rank == 0 else (480, 440)
    s.box(x, PANEL_Y, w, PANEL_H, RANK_COLORS[rank], rx=8, fill_opacity=0.06, stroke_width=1.2)
    s.text(x + 12, PANEL_Y + 22, title, size=13.5, bold=True)
    y = PANEL_Y + 42
    for line in lines:
        if isinstance(line, Cells):
            y += 5
            cw = 62
            for k, (tid, mine) in enumerate(zip(line.ids, line.mine)):
                cx = x + 12 + k * (cw + 6)
                if mine:
                    s.box(cx, y - 15, cw, 21, line.color, rx=3, fill_opacity=0.4, stroke_width=1)
                else:
                    s.box(cx, y - 15, cw, 21, None, rx=3, dashed=True, stroke_width=0.8)
                s.text(cx + cw / 2, y, str(tid), size=12.5, anchor="middle", mono=True,
                       muted=not mine)  # fmt: skip
            y += 25
            continue
        s.text(x + 12, y, line, size=13)
        y += 18.5


def draw_table(s: Svg, table: Table) -> None:
    y = TABLE_Y
    s.text(20, y, table.title, size=13, bold=True)
    y += 22
    cols = len(table.header)
    widths = [
        max(text_width(c, 12.5, mono=True) for c in [h] + [row[2][j] for row in table.rows]) + 22
        for j, h in enumerate(table.header)
    ]
    x0 = 20 + table.label_w
    xs = [x0 + sum(widths[:j]) for j in range(cols)]
    if table.groups:
        j = 0
        for label, n in table.groups:
            left, right = xs[j], xs[j + n - 1] + widths[j + n - 1]
            s.text((left + right) / 2 - 11, y, label, size=12, anchor="middle", muted=True)
            j += n
        y += 18
    for j, h in enumerate(table.header):
        s.text(xs[j] + widths[j] - 22, y, h, size=12, anchor="end", muted=True)
    y += 20
    for i, (label, color, cells) in enumerate(table.rows):
        if i == table.rule:
            s.line(20, y - 14, xs[-1] + widths[-1] - 14, y - 14, width=1.2, opacity=0.7)
            y += 4
        s.text(20, y, label, size=13, color=color, bold=color is not None)
        for j, cell in enumerate(cells):
            s.text(xs[j] + widths[j] - 22, y, cell, size=12.5, anchor="end", mono=True, color=color)
        y += 20


def draw(
    title: str,
    now: Set[str],
    panels: Tuple[Tuple[str, Sequence[Line]], Tuple[str, Sequence[Line]]],
    table: Optional[Table] = None,
    notes: Sequence[str] = (),
    bar: Optional[Bar] = None,
) -> str:
    s = Svg("anim-tp", WIDTH, HEIGHT, "Tensor parallelism on two ranks", title)
    s.text(20, 26, title, size=15, bold=True)
    last = max((KEYS.index(k) for k in now), default=-1)
    draw_lanes(s, now, last)
    for rank, (head, lines) in enumerate(panels):
        draw_panel(s, rank, head, lines)
    y = TABLE_Y
    if bar is not None:
        draw_bar(s, bar)
        y += 80
    if table is not None:
        draw_table(s, table)
    else:
        s.lines(20, y, list(notes), size=13, gap=1.5)
    return s.render()


# ------------------------------------------------------------------------------- frames
def num(v: float) -> str:
    return "0" if v == 0 else f"{v:.4f}"


def vec(values: Sequence[float]) -> str:
    return "[" + ", ".join(num(float(v)) for v in values) + "]"


def shape(a: Any) -> str:
    return dims(a.shape)


def dims(sizes: Sequence[int]) -> str:
    return "[" + ", ".join(str(n) for n in sizes) + "]"


def listed(items: Sequence[object]) -> str:
    words = [str(i) for i in items]
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


class Story:
    """Both ranks' records, and the frames drawn from them."""

    def __init__(self, records: Dict[int, Dict[str, Any]], prompt: List[int], decode: Any) -> None:
        self.rec = [records[r] for r in range(RANKS)]
        self.prompt = prompt
        self.decode = decode
        self.animation = Animation(
            NAME, "Tensor parallelism: one forward step on two ranks", [], 4.0
        )
        for e0, e1 in zip(self.rec[0]["events"], self.rec[1]["events"]):  # the ranks ran in step
            assert (e0["op"], e0.get("layer"), e0.get("by")) == (
                e1["op"],
                e1.get("layer"),
                e1.get("by"),
            )

    def ev(self, rank: int, op: str, layer: Optional[int] = None) -> Dict[str, Any]:
        return next(
            e for e in self.rec[rank]["events"] if e["op"] == op and e.get("layer") == layer
        )

    def coll(self, rank: int, by: str, layer: Optional[int] = None) -> Dict[str, Any]:
        return next(
            e
            for e in self.rec[rank]["events"]
            if e["op"].startswith("all_") and e["by"] == (by, layer)
        )

    def both(self, op: str, layer: Optional[int] = None) -> Tuple[Any, Any]:
        return self.ev(0, op, layer)["y"], self.ev(1, op, layer)["y"]

    def frame(self, title, now, panels, narration, table=None, notes=(), bar=None) -> None:
        self.animation.add(draw(title, set(now), panels, table, notes, bar), narration)

    def same(self, a: Any, b: Any) -> str:
        diff = float(abs(a - b).max())
        return "identical, bit for bit" if diff == 0 else f"max difference {diff:.1e}"

    def whole(self, op: str, layer: Optional[int] = None) -> Any:
        """The output of `op` in the whole model, run on one rank."""
        events = self.rec[0]["whole"]["events"]
        return next(e for e in events if e["op"] == op and e.get("layer") == layer)["y"]

    def reduce_table(self, by: str, layer: Optional[int], what: str) -> Tuple[Table, List[str]]:
        c0, c1 = self.coll(0, by, layer), self.coll(1, by, layer)
        a, b, s0 = c0["x"][0, :SHOWN], c1["x"][0, :SHOWN], c0["y"][0, :SHOWN]
        one = self.whole(by, layer)[0, :SHOWN]
        header = [f"feature {j}" for j in range(SHOWN)]
        table = Table(
            f"token 0 of {what}, the first {SHOWN} of {c0['y'].shape[1]} features",
            header,
            [
                ("rank 0 sends its partial", BLUE, [num(v) for v in a]),
                ("rank 1 sends its partial", ORANGE, [num(v) for v in b]),
                ("both ranks get the sum", COLLECTIVE, [num(v) for v in s0]),
                ("one rank, the whole model", GREY, [num(v) for v in one]),
            ],
            rule=2,
        )
        sums = [f"{num(x)} + {num(y)} = {num(z)}" for x, y, z in zip(a, b, s0)]
        assert (c0["y"] == c1["y"]).all()
        return table, sums

    # ------------------------------------------------------------------------- the frames
    def intro(self) -> None:
        whole = self.rec[0]["whole"]
        ws = whole["shapes"]
        panels = []
        for r, rec in enumerate(self.rec):
            lo, n = rec["vocab_range"]
            lines = [
                f"{name} {dims(rec['shapes'][key])} of {dims(ws[key])}"
                + (f": ids {lo}-{lo + n - 1}" if name == "embed_tokens" else "")
                for name, key in HELD
            ]
            lines.append(f"{rec['params']:,} of the model's {whole['params']:,} parameters")
            panels.append((f"rank {r} · pid {rec['pid']} · set_tp_info({r}, {RANKS})", lines))
        words = [repr(self.decode([t])) for t in self.prompt]
        notes = [
            f"the prompt: {TEXT!r}, {len(self.prompt)} tokens",
            "token ids " + ", ".join(f"{t} ({w})" for t, w in zip(self.prompt, words)),
            "one prefill step: both ranks run it in step; the lanes meet at the collectives",
        ]
        p0, p1 = self.rec[0]["params"], whole["params"]
        self.frame(
            "two ranks, each holding half of tiny Qwen3",
            [],
            tuple(panels),
            f"Two rank processes joined one gloo group, each built tiny Qwen3 with "
            f"set_tp_info(rank, 2) and loaded its slice with load_weight ({p0:,} of the "
            f"model's {p1:,} parameters), and both now run the same prefill of {TEXT!r}, token "
            f"ids {listed(self.prompt)}.",
            notes=notes,
        )

    def embedding(self) -> None:
        panels = []
        said = []
        vocab = sum(rec["vocab_range"][1] for rec in self.rec)

        def owner(t: int) -> int:
            return next(
                r
                for r, rec in enumerate(self.rec)
                if rec["vocab_range"][0] <= t < sum(rec["vocab_range"])
            )

        for r, rec in enumerate(self.rec):
            lo, n = rec["vocab_range"]
            ids = self.ev(r, "embed_tokens")["x"]
            mine = [lo <= t < lo + n for t in ids]
            part = self.coll(r, "embed_tokens")["x"]
            held = [i for i, m in enumerate(mine) if m]
            zero = [i for i, m in enumerate(mine) if not m]
            assert all((part[i] == 0).all() for i in zero)
            panels.append(
                (
                    f"rank {r} · embed_tokens",
                    [
                        f"vocab_range: ids {lo}-{lo + n - 1}, its {n} rows",
                        Cells(ids, mine, RANK_COLORS[r]),
                        f"looks up tokens {listed(held)}; rows {listed(zero)} are zeros",
                        f"partial output {shape(part)}",
                        f"token 0: {vec(part[0, :SHOWN])}",
                        f"token 1: {vec(part[1, :SHOWN])}",
                    ],
                )
            )
            said.append(
                f"rank {r} looks up tokens {listed(held)} (id{'s' * (len(held) > 1)} "
                f"{listed([ids[i] for i in held])}, in its {lo}-{lo + n - 1})"
            )
        self.frame(
            "embed_tokens: each rank looks up the tokens of its half of the vocabulary",
            ["embed"],
            tuple(panels),
            f"embed_tokens is split by vocabulary: {said[0]}, {said[1]}, and each writes zeros "
            f"for the other rank's tokens, so its {shape(part)} output is only a partial one.",
            bar=Bar(
                f"the vocabulary's {vocab} ids, and the prompt's tokens",
                vocab,
                [
                    (lo, lo + n, r, f"rank {r}: ids {lo}-{lo + n - 1}")
                    for r, (lo, n) in enumerate(rec["vocab_range"] for rec in self.rec)
                ],
                [(t, f"{t}", owner(t)) for t in self.prompt],
            ),
            notes=["a token is looked up by exactly one rank: the one whose slice holds its id"],
        )
        c0, c1 = self.coll(0, "embed_tokens"), self.coll(1, "embed_tokens")
        rows = []
        for label, color, values in (
            ("rank 0 sends its partial", BLUE, c0["x"]),
            ("rank 1 sends its partial", ORANGE, c1["x"]),
            ("both ranks get the sum", COLLECTIVE, c0["y"]),
        ):
            rows.append((label, color, [num(v) for v in [*values[0, :SHOWN], *values[1, :SHOWN]]]))
        assert (c0["y"] == c1["y"]).all()
        ids = self.prompt
        table = Table(
            f"tokens 0 and 1, the first {SHOWN} of {c0['y'].shape[1]} features",
            [f"feature {j}" for j in range(SHOWN)] * 2,
            rows,
            groups=[(f"token 0 (id {ids[0]})", SHOWN), (f"token 1 (id {ids[1]})", SHOWN)],
            rule=2,
        )
        panels = tuple(
            (
                f"rank {r} · all_reduce after embed_tokens",
                [
                    f"sends its partial {shape(c['x'])}",
                    f"receives the sum {shape(c['y'])}, in place",
                    f"token 0: {vec(c['y'][0, :SHOWN])}",
                    f"token 1: {vec(c['y'][1, :SHOWN])}",
                    f"the sum on both ranks: {self.same(c0['y'], c1['y'])}",
                    f"one rank, whole model: {self.same(c['y'], self.whole('embed_tokens'))}",
                ],
            )
            for r, c in enumerate((c0, c1))
        )
        t0 = [num(v) for v in (c0["x"][0, 0], c1["x"][0, 0], c0["y"][0, 0])]
        t1 = [num(v) for v in (c0["x"][1, 0], c1["x"][1, 0], c0["y"][1, 0])]
        self.frame(
            "all-reduce: the two partial embeddings add up to the whole one",
            ["ar_embed"],
            panels,
            f"The all-reduce adds the two partial embeddings (token 0's first feature: "
            f"{t0[0]} + {t0[1]} = {t0[2]}; token 1's: {t1[0]} + {t1[1]} = {t1[2]}): exactly one "
            f"rank wrote each row, so both ranks now hold every token's whole embedding.",
            table=table,
        )

    def whole_op(self, op: str, key: str, title: str, narration: str) -> None:
        y0, y1 = self.both(op, 0)
        panels = tuple(
            (
                f"rank {r} · {op}",
                [
                    f"weight {dims(self.rec[r]['shapes'][f'model.layers.0.{op}.weight'])}: whole, "
                    f"on both ranks",
                    f"input {shape(self.ev(r, op, 0)['x'])}, whole after the all-reduce",
                    f"output {shape(y)}",
                    f"token 0: {vec(y[0, :SHOWN])}",
                ],
            )
            for r, y in enumerate((y0, y1))
        )
        same = self.same(y0, y1)
        self.frame(
            title,
            [key],
            panels,
            narration.format(same=same, values=vec(y0[0, :SHOWN])),
            notes=[f"{op}'s output on rank 0 and on rank 1: {same}"],
        )

    def heads(self, rank: int) -> Dict[str, List[int]]:
        """The query and key/value heads `rank` computes (as the loader cut q, k and v)."""
        nq, nkv, _ = self.rec[rank]["heads"]
        return {
            "q": list(range(rank * nq, (rank + 1) * nq)),
            "kv": [rank * nkv + i for i in range(nkv)],
        }

    def qkv(self) -> None:
        tq, tkv, dim = self.rec[0]["whole"]["heads"]
        whole = self.whole("qkv_proj", 0)
        panels, said, segments, checks = [], [], [], []
        for r in range(RANKS):
            y = self.ev(r, "qkv_proj", 0)["y"]
            h = self.heads(r)
            cols = [j for q in h["q"] for j in range(q * dim, (q + 1) * dim)]
            for base in (tq * dim, (tq + tkv) * dim):  # k, then v
                cols += [base + j for kv in h["kv"] for j in range(kv * dim, (kv + 1) * dim)]
            checks.append(f"rank {r}'s {shape(y)}: {self.same(y, whole[:, cols])}")
            qs, kvs = f"{h['q'][0]}-{h['q'][-1]}", listed(h["kv"])
            panels.append(
                (
                    f"rank {r} · qkv_proj (column split)",
                    [
                        f"input {shape(self.ev(r, 'qkv_proj', 0)['x'])}: whole, on both ranks",
                        f"output {shape(y)} of the layer's {shape(whole)}",
                        f"= q heads {qs}, k head {kvs}, v head {kvs}",
                        f"q of token 0, head {h['q'][0]}: {vec(y[0, :SHOWN])}",
                        "no communication: its input was whole",
                    ],
                )
            )
            said.append(f"query heads {qs} and key/value head {kvs} on rank {r}")
            segments += [(q * dim, (q + 1) * dim, r, f"q head {q}") for q in h["q"]]
            for name, base in (("k", tq * dim), ("v", (tq + tkv) * dim)):
                segments += [
                    (base + kv * dim, base + (kv + 1) * dim, r, f"{name} head {kv}")
                    for kv in h["kv"]
                ]
        self.frame(
            "qkv_proj: each rank computes its own heads",
            ["qkv"],
            tuple(panels),
            f"qkv_proj is split by heads: each rank computes {shape(y)} of the layer's "
            f"{whole.shape[1]} columns ({said[0]}, {said[1]}), with no exchange, since every "
            f"rank had the whole input.",
            bar=Bar(
                f"the whole layer's {whole.shape[1]} output columns, and the rank computing each",
                whole.shape[1],
                sorted(segments),
            ),
            notes=[f"against those columns of the whole model's output: {'; '.join(checks)}"],
        )

    def attention(self) -> None:
        tq, tkv, dim = self.rec[0]["whole"]["heads"]
        whole_k = self.rec[0]["whole"]["k_cache"]
        panels, segments = [], []
        for r in range(RANKS):
            y = self.ev(r, "attn", 0)["y"]
            k = self.rec[r]["k_cache"]
            h = self.heads(r)
            qs, kvs = f"{h['q'][0]}-{h['q'][-1]}", listed(h["kv"])
            panels.append(
                (
                    f"rank {r} · attention (its heads only)",
                    [
                        f"q heads {qs} attend with kv head {kvs}",
                        f"output {shape(y)}: {len(h['q'])} heads of {dim}",
                        f"KV cache of layer 0: {list(k)}",
                        f"(one rank alone holds {list(whole_k)})",
                        f"token 0, head {h['q'][0]}: {vec(y[0, :SHOWN])}",
                    ],
                )
            )
            segments += [(q, q + 1, r, f"q head {q}") for q in h["q"]]
            segments += [(tq + kv, tq + kv + 1, r, f"kv head {kv}") for kv in h["kv"]]
        k = self.rec[0]["k_cache"]
        self.frame(
            "attention: heads never mix, so each rank attends alone",
            ["attn"],
            tuple(panels),
            f"Attention runs on each rank's own {len(h['q'])} query heads and {k[2]} key/value "
            f"head (its KV cache of layer 0 is {list(k)}, one rank alone would need "
            f"{list(whole_k)}); heads never mix, so nothing is exchanged.",
            bar=Bar(
                f"the {tq} query heads and {tkv} key/value heads of a layer, by rank",
                tq + tkv,
                sorted(segments),
            ),
            notes=["each rank stores and reads only the keys and values of its own heads"],
        )

    def row_split(self, op: str, key: str, ar_key: str, what: str, unit: str) -> None:
        panels, parts, segments = [], [], []
        full = self.rec[0]["whole"]["shapes"][f"model.layers.0.{unit}.weight"][1]
        for r in range(RANKS):
            e = self.ev(r, op, 0)
            part = self.coll(r, op, 0)["x"]
            n = e["x"].shape[1]
            parts.append(vec(part[0, :SHOWN]))
            inputs = (
                f"heads {self.heads(r)['q'][0]}-{self.heads(r)['q'][-1]}"
                if op == "o_proj"
                else f"features {r * n}-{(r + 1) * n - 1}"
            )
            panels.append(
                (
                    f"rank {r} · {op} (row split)",
                    [
                        f"input {shape(e['x'])}: {inputs}",
                        f"weight {dims(self.rec[r]['shapes'][f'model.layers.0.{unit}.weight'])}: "
                        f"its {n} columns of {full}",
                        f"output {shape(part)}: a partial sum",
                        f"token 0: {vec(part[0, :SHOWN])}",
                    ],
                )
            )
            segments.append((r * n, (r + 1) * n, r, f"rank {r}: {inputs}"))
        self.frame(
            f"{op}: each rank's product is a partial sum of the whole output",
            [key],
            tuple(panels),
            f"{op}: each rank multiplies {what} by the matching {n} columns of the weight, which "
            f"gives a partial sum of the whole {shape(part)} output (token 0 starts {parts[0]} "
            f"on rank 0, {parts[1]} on rank 1).",
            bar=Bar(f"{op}'s {full} input features, and the rank holding each", full, segments),
            notes=["the whole output is the sum of the two partial ones"],
        )
        table, sums = self.reduce_table(op, 0, f"{op}'s output")
        c0, c1 = self.coll(0, op, 0), self.coll(1, op, 0)
        panels = tuple(
            (
                f"rank {r} · all_reduce after {op}",
                [
                    f"sends its partial {shape(c['x'])}",
                    f"receives the sum {shape(c['y'])}, in place",
                    f"token 0: {vec(c['y'][0, :SHOWN])}",
                    f"the sum on both ranks: {self.same(c0['y'], c1['y'])}",
                    f"one rank, whole model: {self.same(c['y'], self.whole(op, 0))}",
                ],
            )
            for r, c in enumerate((c0, c1))
        )
        one = num(self.whole(op, 0)[0, 0])
        self.frame(
            f"all-reduce: the partial sums of {op} add up, on both ranks",
            [ar_key],
            panels,
            f"The all-reduce adds the partial sums, {sums[0]} for token 0's first feature, and "
            f"leaves the same sum on both ranks: what one rank with the whole {op} computes "
            f"({one}).",
            table=table,
        )

    def mlp_up(self) -> None:
        whole = self.whole("gate_up_proj", 0)
        features = whole.shape[1] // 2
        panels, segments, checks = [], [], []
        for r in range(RANKS):
            y = self.ev(r, "gate_up_proj", 0)["y"]
            act = self.ev(r, "act_fn", 0)["y"]
            half = y.shape[1] // 2
            mine = range(r * half, (r + 1) * half)
            cols = [*mine, *(features + j for j in mine)]
            checks.append(f"rank {r}'s {shape(y)}: {self.same(y, whole[:, cols])}")
            span = f"{mine[0]}-{mine[-1]}"
            panels.append(
                (
                    f"rank {r} · gate_up_proj (column split), SiLU",
                    [
                        f"output {shape(y)} of the layer's {shape(whole)}",
                        f"gate features {span}, and the same of up",
                        f"SiLU(gate) × up: {shape(act)}, its features",
                        f"token 0: {vec(act[0, :SHOWN])}",
                        "no communication: each feature is on one rank",
                    ],
                )
            )
            segments += [
                (mine[0], mine[-1] + 1, r, f"gate {span}"),
                (features + mine[0], features + mine[-1] + 1, r, f"up {span}"),
            ]
        self.frame(
            "gate_up_proj and SiLU: each rank computes its half of the features",
            ["gate_up", "silu"],
            tuple(panels),
            f"gate_up_proj is split by features: each rank computes {half} of the {features} "
            f"gate features and the same {half} of up, and SiLU(gate) × up works on each feature "
            f"alone, so each rank gets its half, {shape(act)}, with no exchange.",
            bar=Bar(
                f"the whole layer's {whole.shape[1]} output columns, and the rank computing each",
                whole.shape[1],
                sorted(segments),
            ),
            notes=[f"against those columns of the whole model's output: {'; '.join(checks)}"],
        )

    def more_layers(self) -> None:
        n = self.rec[0]["num_layers"]
        rows, said = [], []
        for layer in range(1, n):
            for op in ("o_proj", "down_proj"):
                c0, c1 = self.coll(0, op, layer), self.coll(1, op, layer)
                assert (c0["y"] == c1["y"]).all()
                a, b, z = c0["x"][0, 0], c1["x"][0, 0], c0["y"][0, 0]
                rows.append((f"layer {layer}, after {op}", None, [num(a), num(b), num(z)]))
                said.append(f"{num(a)} + {num(b)} = {num(z)}")
        count = len(rows)
        panels = tuple(
            (
                f"rank {r} · layers 1-{n - 1}",
                [
                    "the same as layer 0, on its slices",
                    f"{count} more all-reduces, each adding partial sums",
                    f"output of layer {n - 1}: {shape(self.coll(r, 'down_proj', n - 1)['y'])}",
                    f"token 0: {vec(self.coll(r, 'down_proj', n - 1)['y'][0, :SHOWN])}",
                ],
            )
            for r in range(RANKS)
        )
        table = Table(
            "token 0's first feature at each all-reduce",
            ["rank 0 sends", "rank 1 sends", "both get"],
            rows,
        )
        self.frame(
            f"layers 1-{n - 1}: the same, two all-reduces each",
            ["more"],
            panels,
            f"Layers 1 and {n - 1} do the same on their slices, with {count} more all-reduces "
            f"of partial sums (token 0's first feature: {'; '.join(said)}).",
            table=table,
        )

    def head(self) -> None:
        vocab = self.rec[0]["vocab_range"][1]
        ranges = [rec["vocab_range"] for rec in self.rec]
        panels, said, bests = [], [], []
        for r, rec in enumerate(self.rec):
            lo, n = rec["vocab_range"]
            h = self.ev(r, "lm_head")["x"]
            part = self.coll(r, "lm_head")["x"]
            best = int(part[0].argmax())
            panels.append(
                (
                    f"rank {r} · final norm, lm_head",
                    [
                        f"final norm, last token only: {shape(h)}",
                        f"token {len(self.prompt) - 1}: {vec(h[0, :SHOWN])}",
                        f"lm_head: the embedding's rows {lo}-{lo + n - 1}",
                        f"logits of its slice: {shape(part)}",
                        f"its best: id {lo + best}, logit {part[0, best]:.4f}",
                    ],
                )
            )
            said.append(f"rank {r}'s best is id {lo + best} ({part[0, best]:.4f})")
            bests.append(lo + best)
        h0, h1 = self.ev(0, "lm_head")["x"], self.ev(1, "lm_head")["x"]
        self.frame(
            "final norm and lm_head: each rank scores its half of the vocabulary",
            ["norm", "lm_head"],
            tuple(panels),
            f"The final norm keeps the last token, {shape(h0)}, the same on both ranks, and the "
            f"LM head, tied to the embedding, scores each rank's {vocab} ids: {said[0]}, "
            f"{said[1]}.",
            bar=Bar(
                f"the vocabulary's {sum(n for _, n in ranges)} ids, and each rank's best logit",
                sum(n for _, n in ranges),
                [
                    (lo, lo + n, r, f"rank {r}: ids {lo}-{lo + n - 1}")
                    for r, (lo, n) in enumerate(ranges)
                ],
                [(t, f"{t}", r) for r, t in enumerate(bests)],
            ),
            notes=[f"the last token's hidden state on rank 0 and on rank 1: {self.same(h0, h1)}"],
        )

    def gather(self) -> None:
        c0, c1 = self.coll(0, "lm_head"), self.coll(1, "lm_head")
        logits = [self.ev(r, "lm_head")["y"] for r in range(RANKS)]
        rows = []
        for r, c in enumerate((c0, c1)):
            lo = self.rec[r]["vocab_range"][0]
            best = int(c["x"][0].argmax())
            rows.append(
                (
                    f"rank {r} sends",
                    RANK_COLORS[r],
                    [shape(c["x"]), str(lo + best), f"{c['x'][0, best]:.4f}"],
                )
            )
        top = int(logits[0][0].argmax())
        rows.append(
            ("both ranks get", COLLECTIVE, [shape(logits[0]), str(top), f"{logits[0][0, top]:.4f}"])
        )
        table = Table(
            "the last token's logits",
            ["shape", "best id", "its logit"],
            rows,
            rule=2,
        )
        panels = tuple(
            (
                f"rank {r} · all_gather in lm_head",
                [
                    f"sends its logits {shape(c['x'])}",
                    f"receives {shape(c['y'])}: rank 0's first",
                    f"view {dims([RANKS, *c['x'].shape])}, transpose: {shape(logits[r])}",
                    f"argmax: id {int(logits[r][0].argmax())} ({self.decode([top])!r})",
                    f"the logits on both ranks: {self.same(logits[0], logits[1])}",
                ],
            )
            for r, c in enumerate((c0, c1))
        )
        winner = 0 if top < self.rec[1]["vocab_range"][0] else 1
        self.frame(
            "all-gather: the two halves of the logits side by side, on both ranks",
            ["gather"],
            panels,
            f"The all-gather stacks the ranks' {shape(c0['x'])} logits, rank 0's first, into "
            f"{shape(c0['y'])}, and a view and a transpose put them side by side, "
            f"{shape(logits[0])}, on both ranks: the best is rank {winner}'s id {top}.",
            table=table,
        )

    def sample(self) -> None:
        whole = self.rec[0]["whole"]
        tokens = [rec["next_token"] for rec in self.rec]
        gathered = [self.ev(r, "lm_head")["y"][0] for r in range(RANKS)]
        one = self.whole("lm_head")[0]
        diff = float(abs(gathered[0] - one).max())
        word = self.decode([tokens[0]])

        def best(logits: Any) -> List[str]:
            order = logits.argsort()[::-1][:SHOWN]
            return [f"{int(i)}: {logits[i]:.4f}" for i in order]

        margin = sorted(gathered[0])[-1] - sorted(gathered[0])[-2]
        panels = tuple(
            (
                f"rank {r} · the sampler",
                [
                    f"logits {shape(self.ev(r, 'lm_head')['y'])}, greedy: their argmax",
                    f"next token: {tokens[r]} ({self.decode([tokens[r]])!r})",
                    f"ahead of the second by {margin:.4f}",
                    "the next step's input, on every rank",
                ],
            )
            for r in range(RANKS)
        )
        table = Table(
            f"the {SHOWN} best logits of the last token (id: logit)",
            [f"{k + 1}{'st' if k == 0 else 'nd' if k == 1 else 'rd'}" for k in range(SHOWN)],
            [
                ("rank 0, gathered", BLUE, best(gathered[0])),
                ("rank 1, gathered", ORANGE, best(gathered[1])),
                ("one rank, the whole model", GREY, best(one)),
            ],
            rule=2,
        )
        self.frame(
            f"both ranks sample token {tokens[0]}",
            ["argmax"],
            panels,
            f"Both ranks sample token {tokens[0]} ({word!r}) from the same logits, so they stay "
            f"in step; the whole model on one rank picks {whole['next_token']} too, its logits "
            f"within {diff:.1e} of theirs (the same sums, added in another order).",
            table=table,
        )

    def all_frames(self) -> Animation:
        self.intro()
        self.embedding()
        self.whole_op(
            "input_layernorm",
            "norm_in",
            "input_layernorm: whole, the same on both ranks",
            "input_layernorm is not split: its input is whole after the all-reduce and its small "
            "weights are on both ranks, so both compute the same output ({same}; token 0 starts "
            "{values}).",
        )
        self.qkv()
        self.attention()
        nq = self.rec[0]["heads"][0]
        self.row_split(
            "o_proj", "o_proj", "ar_o", f"the {nq} heads it computed", "self_attn.o_proj"
        )
        self.whole_op(
            "post_attention_layernorm",
            "norm_post",
            "post_attention_layernorm: the residual add and the norm, whole",
            "post_attention_layernorm adds the attention's output to the residual stream and "
            "normalises, whole on both ranks: the same output ({same}; token 0 starts {values}).",
        )
        self.mlp_up()
        self.row_split(
            "down_proj", "down", "ar_down", "its half of the MLP's features", "mlp.down_proj"
        )
        self.more_layers()
        self.head()
        self.gather()
        self.sample()
        return self.animation


# ------------------------------------------------------------------------------- recording
def record() -> Animation:
    import torch
    from tokenizers import Tokenizer

    from minisgl.distributed import DistributedInfo
    from minisgl.scheduler import SchedulerConfig
    from minisgl.utils import worker_context
    from tools.models import ensure_model
    from tools.processes import finish, receive, stopped_on_exit

    path = ensure_model(MODEL)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    prompt = tokenizer.encode(TEXT, add_special_tokens=False).ids
    config = SchedulerConfig(
        model_path=str(path),
        tp_info=DistributedInfo(0, RANKS),
        dtype=torch.float32,
        max_running_req=1,
        page_size=4,
        num_page_override=4,
    )
    ctx = worker_context([__name__, "minisgl.engine"])
    out: mp.Queue = ctx.Queue()
    done = ctx.Event()
    processes = [
        ctx.Process(
            target=_rank,
            args=(replace(config, tp_info=DistributedInfo(r, RANKS)), prompt, out, done),
            name=f"rank {r}",
        )
        for r in range(RANKS)
    ]
    with stopped_on_exit(*processes):
        for p in processes:
            p.start()
        records = dict(receive(out, processes, TIMEOUT_S, "a rank's records") for _ in processes)
        done.set()
        finish(processes)
    return Story(records, prompt, tokenizer.decode).all_frames()
