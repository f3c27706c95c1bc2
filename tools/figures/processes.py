"""The processes of a running server and the messages between them."""

from __future__ import annotations

from collections.abc import Sequence

from tools.figures.svg import BLUE, GREY, ORANGE, PURPLE, TEAL, Svg


def fig_processes() -> str:
    """The processes of a running server and the ZMQ messages between them."""
    s = Svg(
        "processes",
        800,
        650,
        "The processes of mini-sglang and the messages between them",
        "A client talks HTTP to the API server. The API server pushes TokenizeMsg to the "
        "tokenizer, which pushes UserMsg to the scheduler of rank 0. Rank 0 republishes each "
        "message to the other ranks over PUB/SUB. Rank 0 pushes DetokenizeMsg to the "
        "detokenizer, which pushes UserReply back to the API server. Each scheduler owns an "
        "Engine on its GPU; the engines all-reduce over NCCL.",
    )
    top, bottom = 95, 315  # the request row and the reply row
    cl_x, cl_w = 6, 66
    api_x, api_w = 130, 136
    tok_x, tok_w = 380, 142
    sch_x, sch_w = 654, 140

    # client
    s.box(cl_x, 150, cl_w, 150, GREY)
    s.text(cl_x + cl_w / 2, 221, "client", size=15, anchor="middle", bold=True)

    # API server
    cx = api_x + api_w / 2
    s.box(api_x, 40, api_w, 330, BLUE)
    s.text(cx, 68, "API server", size=16, anchor="middle", bold=True)
    s.text(cx, 88, "1 process", size=13, anchor="middle", muted=True)
    s.text(cx, 160, "FastAPI", size=14, anchor="middle")
    s.text(cx, 196, "FrontendManager", size=13.5, anchor="middle")
    s.lines(
        cx,
        218,
        ["a uid per request", "replies per uid", "streams SSE"],
        size=13,
        anchor="middle",
        muted=True,
        gap=1.45,
    )

    # tokenizer and detokenizer, one process by default
    tcx = tok_x + tok_w / 2
    s.box(tok_x - 10, 26, tok_w + 20, 358, None, rx=14, dashed=True, stroke_width=1.2)
    s.text(tcx, 200, "one process", size=13, anchor="middle", muted=True)
    s.text(tcx, 217, "by default", size=13, anchor="middle", muted=True)
    for y, title, mgr, job in (
        (40, "tokenizer", "TokenizeManager", "text → ids"),
        (260, "detokenizer", "DetokenizeManager", "ids → text"),
    ):
        s.box(tok_x, y, tok_w, 112, TEAL)
        s.text(tcx, y + 27, title, size=16, anchor="middle", bold=True)
        s.text(tcx, y + 50, "tokenize_worker", size=12.5, anchor="middle", mono=True)
        s.text(tcx, y + 72, mgr, size=13, anchor="middle")
        s.text(tcx, y + 94, job, size=13, anchor="middle", muted=True)

    # scheduler of rank 0 with its engine
    scx = sch_x + sch_w / 2
    s.box(sch_x, 40, sch_w, 330, ORANGE)
    s.text(scx, 68, "scheduler", size=16, anchor="middle", bold=True)
    s.text(scx, 88, "rank 0", size=13, anchor="middle", muted=True)
    y = s.lines(
        sch_x + 12,
        118,
        ["PrefillManager", "DecodeManager", "CacheManager", "TableManager"],
        size=13,
        gap=1.42,
    )
    s.text(sch_x + 12, y + 2, "+ ZMQ queues", size=13, muted=True)
    ex, ew = sch_x + 10, sch_w - 20
    s.box(ex, 250, ew, 108, PURPLE, solid_bg=True)
    s.text(scx, 274, "Engine", size=15, anchor="middle", bold=True)
    s.lines(
        scx,
        295,
        ["GPU 0 · model", "KV pool · sampler", "attention backend"],
        size=12.5,
        anchor="middle",
        muted=True,
        gap=1.4,
    )

    # the other ranks, drawn as a stack of cards
    ry, rh = 470, 140
    for off in (12, 6):
        s.box(sch_x + off, ry + off, sch_w - 12, rh, ORANGE, solid_bg=True, fill_opacity=0.1)
    s.box(sch_x, ry, sch_w, rh, ORANGE, solid_bg=True)
    s.text(scx, ry + 25, "scheduler", size=16, anchor="middle", bold=True)
    s.text(scx, ry + 44, "ranks ≥ 1", size=13, anchor="middle", muted=True)
    s.box(ex, ry + 56, ew, 72, PURPLE, solid_bg=True)
    s.text(scx, ry + 80, "Engine", size=15, anchor="middle", bold=True)
    s.lines(
        scx,
        ry + 100,
        ["GPU r, its weight", "shard; no replies"],
        size=12.5,
        anchor="middle",
        muted=True,
        gap=1.4,
    )

    # HTTP in and out
    mid = (cl_x + cl_w + api_x) / 2
    s.arrow(cl_x + cl_w, 195, api_x - 1, 195)
    s.text(mid, 187, "HTTP", size=13, anchor="middle", bold=True)
    s.arrow(api_x - 1, 255, cl_x + cl_w + 1, 255)
    s.text(mid, 275, "SSE", size=13, anchor="middle", bold=True)

    def msg(x1: float, x2: float, y: float, names: Sequence[str]) -> None:
        s.arrow(x1, y, x2, y)
        m = (x1 + x2) / 2
        base = y - 9 - 17 * (len(names) - 1)
        for i, n in enumerate(names):
            s.text(m, base + 17 * i, n, size=13, anchor="middle", bold=True)
        s.text(m, y + 19, "PUSH → PULL", size=12, anchor="middle", muted=True, mono=True)

    api_r, tok_r = api_x + api_w, tok_x + tok_w
    msg(api_r, tok_x - 1, top, ["TokenizeMsg", "AbortMsg"])
    msg(tok_r, sch_x - 1, top, ["UserMsg", "AbortBackendMsg"])
    msg(sch_x, tok_r + 1, bottom, ["DetokenizeMsg"])
    msg(tok_x, api_r + 1, bottom, ["UserReply"])

    # rank 0 republishes what it received
    px = sch_x + 26
    s.arrow(px, 370, px, ry - 1)
    s.text(px - 10, 404, "PUB → SUB", size=12.5, anchor="end", bold=True, mono=True)
    s.text(px - 10, 423, "the same message bytes;", size=13, anchor="end", muted=True)
    s.text(px - 10, 440, "their count over gloo", size=13, anchor="end", muted=True)

    # tensor-parallel collectives between the engines
    nx = ex + ew - 12
    s.arrow(nx, 359, nx, ry + 55, color=PURPLE, dashed=True, arrow_start=True, width=1.8)
    s.text(nx - 8, 414, "NCCL", size=13, anchor="end", bold=True, color=PURPLE)
    s.text(nx - 8, 431, "all-reduce", size=13, anchor="end", color=PURPLE)

    # legend
    lx, ly, lw = 6, 478, 450
    s.box(lx, ly, lw, 132, None, rx=10, stroke_width=1)
    s.arrow(lx + 14, ly + 26, lx + 64, ly + 26)
    s.text(lx + 76, ly + 31, "a ZMQ message (msgpack bytes)", size=13)
    s.arrow(
        lx + 14, ly + 54, lx + 64, ly + 54, color=PURPLE, dashed=True, arrow_start=True, width=1.8
    )
    s.text(lx + 76, ly + 59, "a collective on GPU tensors", size=13)
    s.lines(
        lx + 14,
        ly + 88,
        [
            "BatchTokenizerMsg, BatchBackendMsg and",
            "BatchFrontendMsg carry several messages at once.",
        ],
        size=13,
        muted=True,
        gap=1.4,
    )
    return s.render()
