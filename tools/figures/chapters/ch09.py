"""Figures of chapter 09 (radix cache).

ch09-tree   the tree after the main's workload: eight chat prompts behind one 39-token system
            prefix, the answers below them, and what each request reused and computed
ch09-split  a second request's match splits a node that a running request holds; reference
            counts along the way
"""

from __future__ import annotations

from tools.figures.svg import CYAN, GREEN, GREY, ORANGE, Svg, text_width

# The tree that examples/ch09_radix.py::show_reuse builds (it prints the first 12 lines; the rest
# was read from the same run). Each node: (text shown, tokens, kind, children); kind "prefix" is
# the shared system prompt, "prompt" a request's own part, "answer" its generated tokens.
# Every question node also ends with the template's "<|im_end|>\n<|im_start|>assistant\n".
Node = tuple[str, int, str, list["Node"]]
TREE: Node = (
    "system prompt + user tag",
    39,
    "prefix",
    [
        ("Why is the sky blue?", 12, "prompt", [("The answer to this …", 9, "answer", [])]),
        ("Who wrote Hamlet?", 10, "prompt", [("The story of Hamlet …", 9, "answer", [])]),
        (
            "What",
            1,
            "prompt",
            [
                (
                    " is",
                    1,
                    "prompt",
                    [
                        (
                            " the capital of France?",
                            11,
                            "prompt",
                            [("The capital of France …", 7, "answer", [])],
                        ),
                        (" 7 times 8?", 12, "prompt", [("To solve this …", 9, "answer", [])]),
                        (" ice made of?", 10, "prompt", [("Ice is composed …", 9, "answer", [])]),
                    ],
                ),
                (" do bees make?", 10, "prompt", [("Bees make honey, …", 9, "answer", [])]),
            ],
        ),
        (
            "How many legs does a spider have?",
            14,
            "prompt",
            [("A spider has 8 legs.", 7, "answer", [])],
        ),
        ("Which planet is the largest?", 12, "prompt", [("The largest planet …", 9, "answer", [])]),
    ],
)

# Per answer leaf, top to bottom: the request, the prompt tokens it found cached and those it
# computed (the prefill batches of the same run; they add up to the printed 278 and 132).
REUSE = [
    ("r1", 39, 12),
    ("r3", 39, 10),
    ("r0", 0, 52),
    ("r2", 41, 12),
    ("r6", 41, 10),
    ("r4", 40, 10),
    ("r5", 39, 14),
    ("r7", 39, 12),
]

KIND_COLOR = {"prefix": CYAN, "prompt": ORANGE, "answer": GREEN}


def fig_tree() -> str:
    s = Svg(
        "ch09-tree",
        940,
        490,
        "The radix tree after eight chat requests",
        "The root has one child: the 39-token system prompt that every request starts with. "
        "Below it, each request's question branches off; questions that begin with 'What' share "
        "a one-token node 'What', and three of them also share ' is'. Below each question hangs "
        "the request's answer, cached when it finished. On the right, what each request found "
        "cached and what it computed: the first request computed all 52 tokens, every later one "
        "only its own part, 132 tokens in all instead of 410.",
    )
    size = 12.5
    box_h, row_h, gap = 30, 46, 16
    top = 70
    leaves: list[Node] = []

    def width(text: str, n: int) -> float:  # generous: fonts differ between renderers
        return 1.12 * text_width(text, size) + 1.12 * text_width(str(n), size, bold=True) + 26

    # place every node: x from its parent, y from the rows of its leaves
    placed: list[tuple[Node, float, float, float]] = []

    def place(node: Node, x: float) -> float:
        text, n, kind, children = node
        w = width(text, n)
        if not children:
            y = top + len(leaves) * row_h
            leaves.append(node)
        else:
            ys = [place(c, x + w + gap) for c in children]
            y = (ys[0] + ys[-1]) / 2
        placed.append((node, x, y, w))
        return y

    root_x = 30
    root_y = place(TREE, root_x + 44)
    pos = {id(node): (x, y, w) for node, x, y, w in placed}

    s.text(
        20, 26, "the cache after the main's 8 requests: 200 tokens in 19 nodes", size=15, bold=True
    )
    s.text(
        20,
        46,
        "each box: the tokens on its edge, decoded, and how many there are",
        size=12.5,
        muted=True,
    )
    # edges first, so boxes sit on top
    s.box(root_x - 16, root_y - 14, 40, 28, GREY, rx=14)
    s.text(root_x + 4, root_y + 4.5, "root", size=11.5, anchor="middle")
    for node, x, y, w in placed:
        for child in node[3]:
            cx, cy, _ = pos[id(child)]
            mid = x + w + gap / 2
            s.path(
                f"M{x + w:.1f},{y:.1f} H{mid:.1f} V{cy:.1f} H{cx:.1f}",
                color=None,
                width=1.1,
                arrow_end=False,
                opacity=0.6,
            )
    tx, ty, _ = pos[id(TREE)]
    s.line(root_x + 24, root_y, tx, ty, color=None, width=1.1, opacity=0.6)
    for node, x, y, w in placed:
        text, n, kind, _ = node
        color = KIND_COLOR[kind]
        s.box(x, y - box_h / 2, w, box_h, color, rx=6, fill_opacity=0.22, stroke_width=1.2)
        s.text(x + 8, y + 4.5, text, size=size)
        s.text(x + w - 7, y + 4.5, str(n), size=size, anchor="end", bold=True, color=color)

    # what each request reused and computed, on its answer's row
    cx, right = 828, 926
    s.text(right, top - 40, "prompt tokens", size=12, anchor="end", muted=True)
    s.text(right, top - 24, "cached + computed", size=12, anchor="end", muted=True)
    for i, (req, cached, computed) in enumerate(REUSE):
        y = top + i * row_h + 4.5
        s.text(cx, y, req, size=13, bold=True)
        s.text(right, y, f"{cached} + {computed}", size=13, anchor="end", mono=True)
    total_y = top + len(REUSE) * row_h - 6
    s.line(cx, total_y - 16, right, total_y - 16, color=None, width=1)
    s.text(cx, total_y + 2, "all", size=13, bold=True)
    s.text(
        right,
        total_y + 2,
        f"{sum(r[1] for r in REUSE)} + {sum(r[2] for r in REUSE)}",
        size=13,
        anchor="end",
        mono=True,
        bold=True,
    )

    # legend
    ly = total_y + 44
    for i, (label, color) in enumerate(
        [
            ("the shared system prompt", CYAN),
            ("a request's own prompt tokens", ORANGE),
            ("its answer, cached when it finished", GREEN),
        ]
    ):
        lx = 20 + i * 270
        s.box(lx, ly - 13, 16, 16, color, rx=3, fill_opacity=0.3, stroke_width=1.1)
        s.text(lx + 24, ly, label, size=12.5)
    return s.render()


def fig_split() -> str:
    s = Svg(
        "ch09-split",
        940,
        418,
        "A match that splits a node, with reference counts",
        "Four moments. One: request A runs with prompt 1 2 3 4 in slots 100 to 103, one node "
        "with reference count 1. Two: request B's prompt 1 2 7 8 9 matches two tokens; the walk "
        "splits the node into 1 2 and 3 4, the new head copies the count 1, and B's lock raises "
        "it to 2. Three: after B's prefill, inserting 1 2 7 8 9 adds a leaf 7 8 9 in B's own "
        "slots 104 to 106; B's handle moves to it. Four: A finishes; unlocking walks from 3 4 "
        "through 1 2, which drops to 1 and stays protected, because B still uses it.",
    )
    panels = [
        (
            "1  A is running",
            ["A's prompt was inserted after", "its prefill, and A holds it"],
            ("1 2 3 4", "100-103", 1, "A"),
            [],
            ["one node, one lock"],
            (0, 4),
        ),
        (
            "2  B's prompt 1 2 7 8 9",
            ["matching 1 2 7 8 stops inside", "the node: split_at(2)"],
            ("1 2", "100-101", "1+1", "A B"),
            [("3 4", "102-103", 1, "A", None)],
            ["the head copies the node's ref 1;", "B's lock adds 1"],
            (0, 4),
        ),
        (
            "3  B's prefill is done",
            ["insert 1 2 7 8 9: the cache", "had 2 tokens (cached_len 2)"],
            ("1 2", "100-101", 2, "A B"),
            [("3 4", "102-103", 1, "A", None), ("7 8 9", "104-106", 1, "B", "new")],
            ["a new leaf in B's own slots;", "B's lock moves down to it"],
            (0, 7),
        ),
        (
            "4  A finishes",
            ["unlocking walks up from", "[3 4] through [1 2]"],
            ("1 2", "100-101", 1, "B"),
            [("3 4", "102-103", 0, "", None), ("7 8 9", "104-106", 1, "B", None)],
            ["[3 4] may be evicted now;", "[1 2] may not: B uses it"],
            (2, 5),
        ),
    ]
    pw = 228
    for i, (title, sub, head, children, note, (evictable, protected)) in enumerate(panels):
        x0 = 10 + i * (pw + 4)
        cx = x0 + pw / 2
        s.box(x0, 10, pw, 398, None, rx=12, stroke_width=1, dashed=True)
        s.text(x0 + 12, 34, title, size=14, bold=True)
        s.lines(x0 + 12, 54, sub, size=11.5, muted=True, gap=1.3)
        s.box(cx - 22, 84, 44, 24, GREY, rx=12)
        s.text(cx, 100, "root", size=11.5, anchor="middle")
        key, slots, ref, who = head
        nw, nh = 118, 70
        ny = 128
        s.line(cx, 108, cx, ny, color=None, width=1.2)
        s.box(cx - nw / 2, ny, nw, nh, ORANGE if i == 1 else CYAN, rx=8)
        node_text(s, cx, ny, key, slots, ref, who)
        cy = 246
        xs = [cx - 56, cx + 56] if len(children) == 2 else [cx] * len(children)
        for (ckey, cslots, cref, cwho, mark), ccx in zip(children, xs, strict=True):
            s.path(
                f"M{cx:.1f},{ny + nh} V{ny + nh + 14} H{ccx:.1f} V{cy}",
                color=None,
                width=1.2,
                arrow_end=False,
            )
            color = GREEN if mark == "new" else CYAN
            s.box(ccx - 52, cy, 104, nh, color, rx=8, dashed=cref == 0)
            node_text(s, ccx, cy, ckey, cslots, cref, cwho)
        s.lines(cx, 340, note, size=11.5, anchor="middle", gap=1.3)
        s.text(
            cx,
            392,
            f"protected {protected}, evictable {evictable}",
            size=12,
            anchor="middle",
            mono=True,
        )
    return s.render()


def node_text(s: Svg, cx: float, y: float, key: str, slots: str, ref: int | str, who: str) -> None:
    s.text(cx, y + 20, f"[{key}]", size=13, anchor="middle", mono=True, bold=True)
    s.text(cx, y + 38, f"slots {slots}", size=11.5, anchor="middle", muted=True)
    label = f"ref {ref}" + (f"  ({who})" if who else "")
    s.text(cx, y + 58, label, size=12, anchor="middle", mono=True)
