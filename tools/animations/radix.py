"""The radix cache at work (chapter 09), recorded from a real run of ``LLM.generate``.

SmolLM2 answers five chat requests one after another, all behind the same system prompt, with
a KV pool too small to keep everything. The recorder wraps the cache manager's calls into the
radix cache (match at admission, insert when a request finishes, evict when pages run out),
snapshots the real tree after each, and draws it: every node with its decoded tokens, their
count and its reference count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

from tools.animations import Animation
from tools.figures.svg import CYAN, GREEN, GREY, ORANGE, RED, Svg

NAME = "radix-cache"
SOURCES = [
    "tools/animations/radix.py",
    "tools/animations/__init__.py",
    "minisgl/kvcache/radix_cache.py",
    "minisgl/scheduler/cache.py",
]
SYSTEM = "You are a concise assistant. Answer in one short sentence."
QUESTIONS = [
    "What is the capital of France?",
    "What is the capital of Italy?",
    "Why is the sky blue?",
    "What is the capital of Spain?",
    "Name a primary colour.",
]
MAX_TOKENS = 5
NUM_PAGES = 80  # slots in the KV pool: the fifth request must evict
WIDTH, HEIGHT = 940, 360


@dataclass
class NodeView:
    uid: int
    text: str
    length: int
    ref: int
    stamp: int
    children: List["NodeView"] = field(default_factory=list)


def snapshot(cache, decode) -> NodeView:
    def view(node) -> NodeView:
        text = "" if node.is_root() else decode(node._key.tolist())
        kids = sorted(node.children.values(), key=lambda n: n.uuid)
        return NodeView(
            node.uuid,
            text,
            node.length if not node.is_root() else 0,
            node.ref_count,
            node.timestamp,
            [view(k) for k in kids],
        )

    return view(cache.root_node)


def all_nodes(root: NodeView) -> List[NodeView]:
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children)
    return out


def short(text: str, limit: int = 17) -> str:
    """A node's text in a box: chat-template markers as ▸ (start) and ◂ (end), newlines as ⏎."""
    text = text.replace("<|im_start|>", "▸").replace("<|im_end|>", "◂").replace("\n", "⏎")
    return text if len(text) <= limit else text[: limit - 7] + "…" + text[-6:]


def draw(root: NodeView, title: str, marks: Dict[int, str], pool: Tuple[int, int, int]) -> str:
    """The tree, left to right; `marks` colours nodes by uid (matched, new, evicted ...)."""
    s = Svg("anim-radix", WIDTH, HEIGHT, "The radix cache", title)
    s.text(20, 28, title, size=15, bold=True)
    box_h, row_h, top, left = 30, 40, 62, 20

    def deepest(node: NodeView, d: int) -> int:
        return max([d] + [deepest(c, d + 1) for c in node.children])

    col_w = min(230.0, (WIDTH - left - 64 - 10) / max(deepest(root, 0), 1))
    rows: List[Tuple[NodeView, int, float]] = []
    leaf_count = [0]

    def place(node: NodeView, depth: int) -> float:
        if not node.children:
            y = top + leaf_count[0] * row_h
            leaf_count[0] += 1
        else:
            ys = [place(c, depth + 1) for c in node.children]
            y = (ys[0] + ys[-1]) / 2
        rows.append((node, depth, y))
        return y

    place(root, 0)
    where = {n.uid: (d, y) for n, d, y in rows}
    for node, depth, y in rows:
        for child in node.children:
            cd, cy = where[child.uid]
            x1 = left + 56 if depth == 0 else left + 64 + (depth - 1) * col_w + col_w - 24
            x2 = left + 64 + (cd - 1) * col_w
            mid = (x1 + x2) / 2
            s.path(
                f"M{x1:.1f},{y:.1f} H{mid:.1f} V{cy:.1f} H{x2:.1f}",
                color=None,
                width=1.1,
                arrow_end=False,
                opacity=0.55,
            )
    colours = {"match": CYAN, "new": GREEN, "split": ORANGE, "evict": RED}
    for node, depth, y in rows:
        if depth == 0:
            s.box(left, y - 14, 56, 28, GREY, rx=14)
            s.text(left + 28, y + 4.5, "root", size=12, anchor="middle")
            continue
        x = left + 64 + (depth - 1) * col_w
        w = col_w - 24
        mark = marks.get(node.uid)
        colour = colours.get(mark or "", GREY)
        s.box(
            x,
            y - box_h / 2,
            w,
            box_h,
            colour,
            rx=6,
            fill_opacity=0.26 if mark else 0.12,
            stroke_width=1.8 if mark else 1,
        )
        s.text(x + 7, y + 4.5, short(node.text), size=12, mono=True)
        s.text(x + w - 6, y + 4.5, f"{node.length} r{node.ref}", size=12, anchor="end", bold=True)
    free, cached, total = pool
    s.text(
        20,
        HEIGHT - 40,
        f"KV pool: {total} slots · {cached} cached in the tree · {free} free",
        size=13,
    )
    key = "each box: its tokens, decoded (▸ ◂ the chat template's start and end, ⏎ a newline)"
    s.text(20, HEIGHT - 18, key + ", how many, r = reference count", size=12, muted=True)
    for i, (label, colour) in enumerate(
        [("matched", CYAN), ("new", GREEN), ("split off", ORANGE), ("evicted", RED)]
    ):
        s.box(560 + i * 95, HEIGHT - 52, 14, 14, colour, rx=3, fill_opacity=0.3)
        s.text(580 + i * 95, HEIGHT - 40, label, size=12)
    return s.render()


def record() -> Animation:
    import torch

    from minisgl.core import SamplingParams
    from minisgl.llm import LLM
    from tools.models import SMOLLM2, ensure_model
    from tools.parity import load_tokenizer

    tok = load_tokenizer(SMOLLM2)
    llm = LLM(
        str(ensure_model(SMOLLM2)),
        dtype=torch.float32,
        max_running_req=2,
        page_size=1,
        num_page_override=NUM_PAGES,
        cache_type="radix",
    )
    manager, cache = llm.cache_manager, llm.cache_manager.prefix_cache
    animation = Animation("radix-cache", "The radix cache: match, split, insert, evict")
    decode = tok.decode
    current: Dict[str, str] = {"req": "a request"}  # the request being served
    names: Dict[int, str] = {}  # id(req) -> "r1", "r2", ... in order of arrival

    def pool() -> Tuple[int, int, int]:
        info = cache.size_info
        return len(manager.free_slots), info.total_size, NUM_PAGES

    def frame(title: str, marks: Dict[int, str], narration: str) -> None:
        animation.add(draw(snapshot(cache, decode), title, marks, pool()), narration)

    match_req, cache_req, evict = manager.match_req, manager.cache_req, cache.evict

    def recording_match(req):
        before = {n.uid: n.length for n in all_nodes(snapshot(cache, decode))}
        result = match_req(req)
        after = snapshot(cache, decode)
        handle = result.cuda_handle
        path, node = set(), handle.node
        while not node.is_root():
            path.add(node.uuid)
            node = node.parent
        marks = {uid: "match" for uid in path}
        split = [n for n in all_nodes(after) if n.uid not in before and n.uid != 0]
        for n in split:
            marks[n.uid] = "match" if n.uid in path else "split"
        for n in all_nodes(after):
            if n.uid in before and before[n.uid] != n.length and n.uid not in path:
                marks[n.uid] = "split"
        label = names.setdefault(id(req), f"r{len(names) + 1}")
        current["req"] = label
        n_prompt = len(req.input_ids)
        said = (
            f"{label} arrives with {n_prompt} prompt tokens. match_prefix walks the tree and "
            f"finds {handle.cached_len} of them cached"
        )
        if split:
            said += "; the match ends inside a node, so that node is split in two at that point"
        if handle.cached_len == 0:
            said = f"{label} arrives with {n_prompt} prompt tokens; the tree is empty"
        frame(f"{label}: match_prefix", marks, said + ".")
        return result

    def recording_cache_req(req, *, finished: bool):
        before = {n.uid for n in all_nodes(snapshot(cache, decode))}
        cache_req(req, finished=finished)
        after = snapshot(cache, decode)
        new = [n for n in all_nodes(after) if n.uid not in before]
        marks = {n.uid: "new" for n in new}
        added = sum(n.length for n in new)
        label = current["req"]
        if not finished:
            frame(
                f"{label}'s prefill is done: cache_req",
                marks,
                f"{label}'s prompt has been computed. cache_req puts the {added} tokens it has "
                f"computed so far, which the tree did not have, into a new leaf, so that a "
                f"request arriving now could reuse them; {label} holds a lock on its path "
                f"(reference count 1) while it runs.",
            )
            return
        frame(
            f"{label} finishes: cache_req",
            marks,
            f"{label} finishes. Its remaining {added} tokens join the tree (the last sampled "
            f"token has no K/V yet, so it is not cached); the lock is released: reference "
            f"counts drop to 0 and the nodes become evictable.",
        )

    def recording_evict(size: int):
        doomed = []
        leaves = sorted(
            (
                n
                for n in all_nodes(snapshot(cache, decode))
                if not n.children and n.ref == 0 and n.uid != 0
            ),
            key=lambda n: n.stamp,
        )
        got = 0
        for leaf in leaves:
            if got >= size:
                break
            doomed.append(leaf.uid)
            got += leaf.length
        frame(
            "the pool is short: evict",
            {uid: "evict" for uid in doomed},
            f"{current['req']} needs {size} more free slots than the pool has. evict takes "
            f"the least recently used leaves that no running request holds (reference count 0), "
            f"oldest first.",
        )
        freed = evict(size)
        frame(
            "after the eviction",
            {},
            f"{len(freed)} slots go back to the free list; the shared system prompt, in use "
            f"again and again, stays cached.",
        )
        return freed

    manager.match_req = recording_match  # type: ignore[method-assign]
    manager.cache_req = recording_cache_req  # type: ignore[method-assign]
    cache.evict = recording_evict  # type: ignore[method-assign]
    try:
        frame(
            "an empty cache",
            {},
            f"An empty radix cache and a KV pool of {NUM_PAGES} slots. "
            f"Five chat requests will come one after another, all with the same "
            f"system prompt.",
        )
        for question in QUESTIONS:
            chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
            text = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
            llm.generate([tok(text).input_ids], [SamplingParams(max_tokens=MAX_TOKENS)])
        cache.check_integrity()
        manager.check_integrity()
    finally:
        llm.shutdown()
    return animation
