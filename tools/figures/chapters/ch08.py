"""Figures of chapter 08 (the CacheManager).

ch08-pages      every page is in one of three places; the calls that move it
ch08-cache-req  the four ranges of a request's page-table row in cache_req
ch08-admission  admission in whole pages: the main's pool of 16 pages of 4, and the test's pool
                of 3 pages of 16, where counting tokens admits more than the pages can hold
"""

from __future__ import annotations

from tools.figures.svg import CYAN, GREEN, GREY, ORANGE, PURPLE, RED, Svg


def fig_pages() -> str:
    s = Svg(
        "ch08-pages",
        940,
        470,
        "Every page is in one of three places",
        "Three boxes: the free list, the running requests and the prefix cache. allocate_paged "
        "moves pages from the free list to a request. cache_req hands a request's computed pages "
        "to the prefix cache, and frees the duplicates and, when the request has finished, the "
        "tail the cache does not take. evict moves unlocked cached pages back to the free list "
        "when an allocation runs short. A matched prefix is shared with a request, not moved: it "
        "is locked while the request uses it. check_integrity checks, when no request runs, that "
        "free pages plus cached pages make all pages.",
    )
    s.text(20, 28, "where a page can be, and what moves it", size=16, bold=True)
    fx, fy, fw, fh = 40, 70, 250, 120
    cx, cy = 650, 70
    rx, ry, rw, rh = 345, 270, 250, 110
    s.box(fx, fy, fw, fh, GREEN, rx=10)
    s.text(fx + fw / 2, fy + 32, "free list", size=16, bold=True, anchor="middle")
    s.lines(
        fx + fw / 2,
        fy + 58,
        ["CacheManager.free_slots", "one entry per page:", "its first slot"],
        size=12.5,
        muted=True,
        anchor="middle",
    )
    s.box(cx, cy, fw, fh, CYAN, rx=10)
    s.text(cx + fw / 2, cy + 32, "prefix cache", size=16, bold=True, anchor="middle")
    s.lines(
        cx + fw / 2,
        cy + 58,
        [
            "size_info: evictable + protected",
            "protected: locked by a running",
            "request; evictable: the rest",
        ],
        size=12.5,
        muted=True,
        anchor="middle",
    )
    s.box(rx, ry, rw, rh, ORANGE, rx=10)
    s.text(rx + rw / 2, ry + 32, "a running request", size=16, bold=True, anchor="middle")
    s.lines(
        rx + rw / 2,
        ry + 58,
        ["its row of the page table:", "the pages of its own tokens"],
        size=12.5,
        muted=True,
        anchor="middle",
    )

    # free -> request
    s.path(
        f"M{fx + 70},{fy + fh + 2} C{fx + 70},{ry + 60} {rx - 60},{ry + 60} {rx - 2},{ry + 60}",
        color=GREEN,
    )
    s.label_bg(fx + 95, ry + 40, "allocate_paged", size=13, mono=True, bold=True)
    s.label_bg(fx + 95, ry + 58, "(_allocate)", size=12, muted=True)
    # request -> free
    s.arrow(rx + 25, ry - 2, fx + fw - 30, fy + fh + 4, color=RED)
    s.text(298, 224, "cache_req: _free", size=13, mono=True, bold=True, anchor="end")
    s.lines(
        298,
        241,
        ["duplicates, and the tail", "when finished"],
        size=12,
        muted=True,
        anchor="end",
        gap=1.3,
    )
    # request -> cache
    s.arrow(rx + rw - 35, ry - 2, cx + 40, cy + fh + 4, color=CYAN)
    s.text(642, 224, "cache_req: insert_prefix", size=13, mono=True, bold=True)
    s.text(642, 241, "the cache takes the pages", size=12, muted=True)
    # cache -> request (shared)
    s.path(
        f"M{cx + fw - 60},{cy + fh + 2} C{cx + fw - 60},{ry + 60} {rx + rw + 60},{ry + 60} "
        f"{rx + rw + 2},{ry + 60}",
        color=CYAN,
        dashed=True,
    )
    s.label_bg(cx + fw - 70, ry + 40, "match_req + lock", size=13, mono=True, bold=True)
    s.label_bg(cx + fw - 70, ry + 58, "shared, not moved", size=12, muted=True)
    # cache -> free
    s.arrow(cx - 2, cy + 50, fx + fw + 2, fy + 50, color=GREY)
    s.label_bg((fx + fw + cx) / 2, fy + 44, "evict", size=13, mono=True, bold=True)
    s.label_bg((fx + fw + cx) / 2, fy + 72, "when _allocate runs short", size=12, muted=True)

    s.lines(
        40,
        420,
        [
            "check_integrity, when no request runs: free pages + cached pages == all pages; no "
            "page "
            "is free",
            "twice; every free slot starts a page. With the naive cache the prefix cache is always "
            "empty.",
        ],
        size=13,
        muted=True,
        gap=1.45,
    )
    return s.render()


# An example row: pages of 4; when the request started, the cache held its first page (old
# handle, 4 tokens); meanwhile another request cached positions 4-7; the request has computed 14
# tokens, and a cache that keeps whole pages (chapter 09's radix cache) takes 12 of them.
PAGE, OLD, MATCHED, NEW, END = 4, 4, 8, 12, 14


def fig_cache_req() -> str:
    s = Svg(
        "ch08-cache-req",
        940,
        430,
        "The four ranges of cache_req",
        "A request's page-table row with pages of 4 tokens and 14 computed tokens. Positions 0 to "
        "3 came from the cache when the request started (old handle, 4 tokens): they are only "
        "unlocked. Positions 4 to 7 the request computed, but another request cached the same "
        "tokens meanwhile (matched = 8): these duplicates are freed. Positions 8 to 11 the cache "
        "takes now (new handle, 12 tokens). Positions 12 and 13 fill only part of a page, which "
        "the cache does not take: freed if the request has finished, else kept by the request.",
    )
    s.text(
        20,
        28,
        "cache_req(req): the slots page_table[req.table_idx, 0 .. cached_len-1]",
        size=16,
        bold=True,
    )
    x0, y0, cw = 60, 90, 52
    ranges = [
        (0, OLD, CYAN, "from the cache", ["when it started:", "unlocked only"]),
        (OLD, MATCHED, RED, "duplicates", ["cached meanwhile", "by another request:", "freed"]),
        (MATCHED, NEW, GREEN, "inserted", ["the cache owns", "them now"]),
        (
            NEW,
            END,
            ORANGE,
            "tail",
            ["part of a page the cache", "does not take: freed if", "finished, else kept"],
        ),
    ]
    for c in range(16):
        x = x0 + c * cw
        color = next((col for a, b, col, _, _ in ranges if a <= c < b), None)
        if color is None:
            s.box(x + 2, y0, cw - 4, 38, None, rx=5, dashed=True, stroke_width=0.8)
        else:
            s.box(x + 2, y0, cw - 4, 38, color, rx=5, fill_opacity=0.3, stroke_width=1.2)
        s.text(x + cw / 2, y0 - 8, str(c), size=11.5, anchor="middle", muted=True)
    s.text(x0 - 8, y0 - 8, "position", size=11.5, anchor="end", muted=True)
    for p in range(0, 17, PAGE):  # page boundaries
        s.line(x0 + p * cw, y0 - 26, x0 + p * cw, y0 + 48, color=None, width=2, opacity=0.7)
    for p in range(4):
        s.text(
            x0 + (p * PAGE + PAGE / 2) * cw,
            y0 + 66,
            f"page {p}",
            size=12,
            anchor="middle",
            muted=True,
        )
    # the lengths
    marks = [
        (OLD, "old_handle.cached_len = 4"),
        (MATCHED, "matched = 8"),
        (NEW, "new_handle.cached_len = 12"),
        (END, "req.cached_len = 14"),
    ]
    for i, (p, label) in enumerate(marks):
        x = x0 + p * cw
        y = y0 + 92 + i * 22
        s.line(x, y0 + 40, x, y - 4, color=None, width=1, dashed=True, opacity=0.6)
        if p == END:
            s.text(x - 6, y + 4, label, size=12.5, mono=True, anchor="end")
        else:
            s.text(x + 6, y + 4, label, size=12.5, mono=True)
    # the ranges explained
    by = y0 + 190
    for a, b, color, title, rows in ranges:
        x = x0 + a * cw + 4
        w = ((16 if b == END else b) - a) * cw - 8
        s.box(x, by, w, 96, color, rx=8)
        s.text(x + 10, by + 22, f"[{a}, {b}) {title}", size=13, bold=True)
        s.lines(x + 10, by + 44, rows, size=12.5, muted=True, gap=1.35)
    s.text(
        x0,
        by + 126,
        "With the naive cache both handles are empty and matched is 0: the whole row "
        "is the last range, freed when the request finishes.",
        size=12.5,
        muted=True,
    )
    return s.render()


def fig_admission() -> str:
    s = Svg(
        "ch08-admission",
        940,
        520,
        "Admission in whole pages",
        "Top: the main's pool of 16 pages of 4 slots. Six requests need 17, 15, 19, 15, 16 and 16 "
        "slots, that is 5, 4, 5, 4, 4 and 4 pages. r0, r1 and r2 take 14 pages between them; r3 "
        "needs 4 more and only 2 are left, so r3 waits, and r4 and r5 wait behind it. Bottom: the "
        "test's pool of 3 pages of 16 slots and requests of 13, 20, 11 and 15 tokens. Counted in "
        "tokens, 13 + 20 + 11 = 44 fits 48 slots, but those three requests need 1 + 2 + 1 = 4 "
        "pages, one more than there are. Counted in whole pages, r0 and r1 take all 3 pages and "
        "r2 waits.",
    )
    s.text(
        20,
        28,
        "admission counts each request to its last possible token, in whole pages",
        size=16,
        bold=True,
    )
    # --- the main: 16 pages of 4 -------------------------------------------------------------
    x0, y0, pw = 150, 74, 38
    s.text(
        20,
        y0 - 16,
        "the main: 16 pages of 4 slots (64); every request: prompt + max_tokens 12",
        size=13.5,
        bold=True,
    )
    needs = [("r0", 17, 5), ("r1", 15, 4), ("r2", 19, 5)]
    colors = [ORANGE, PURPLE, GREEN]
    page = 0
    for (name, tokens, pages), color in zip(needs, colors, strict=True):
        s.box(
            x0 + page * pw + 2,
            y0,
            pages * pw - 4,
            34,
            color,
            rx=5,
            fill_opacity=0.3,
            stroke_width=1.2,
        )
        for p in range(1, pages):  # page boundaries inside the request's share
            x = x0 + (page + p) * pw
            s.line(x, y0 + 3, x, y0 + 9, color=color, width=1.2)
            s.line(x, y0 + 25, x, y0 + 31, color=color, width=1.2)
        mid = x0 + (page + pages / 2) * pw
        s.text(mid, y0 + 22, f"{name}: {tokens} -> {pages * 4}", size=12, anchor="middle")
        page += pages
    for p in range(page, 16):
        s.box(x0 + p * pw + 2, y0, pw - 4, 34, None, rx=5, dashed=True, stroke_width=0.8)
    s.text(x0 - 10, y0 + 22, "admitted", size=12.5, anchor="end", muted=True)
    # r3 does not fit
    ry = y0 + 52
    for p in range(4):
        x = x0 + (14 + p) * pw
        s.box(x + 2, ry, pw - 4, 34, RED, rx=5, fill_opacity=0.15, stroke_width=1.2, dashed=True)
    s.text(x0 + 18 * pw + 8, ry + 22, "r3: 15 -> 16", size=12, color=RED)
    s.line(x0 + 16 * pw, y0 - 6, x0 + 16 * pw, ry + 42, color=RED, width=2)
    s.text(
        x0 + 14 * pw - 10,
        ry + 22,
        "does not fit: 56 + 16 = 72 > 64, so r3 waits (r4, r5 behind it)",
        size=12.5,
        anchor="end",
        color=RED,
    )

    # --- the test: 3 pages of 16 -------------------------------------------------------------
    y1 = 250
    s.text(
        20,
        y1 - 16,
        "the test, page_size=16: 3 pages of 16 slots (48); prompts of 3, 10, 1, 5 tokens, "
        "max_tokens 10",
        size=13.5,
        bold=True,
    )
    sw = 10.0  # pixels per slot
    reqs = [("r0", 13, ORANGE), ("r1", 20, PURPLE), ("r2", 11, GREEN)]
    # counted in tokens (upstream)
    s.text(x0 - 10, y1 + 22, "upstream", size=12.5, anchor="end", bold=True)
    s.text(x0 - 10, y1 + 38, "tokens", size=12, anchor="end", muted=True)
    x = x0
    for name, tokens, color in reqs:
        s.box(x + 1, y1, tokens * sw - 2, 34, color, rx=5, fill_opacity=0.3, stroke_width=1.2)
        s.text(x + tokens * sw / 2, y1 + 22, f"{name}: {tokens}", size=12, anchor="middle")
        x += tokens * sw
    s.line(x0 + 48 * sw, y1 - 8, x0 + 48 * sw, y1 + 42, color=None, width=2)
    s.text(x0 + 48 * sw + 8, y1 + 16, "48 slots", size=12, muted=True)
    s.text(x0 + 48 * sw + 8, y1 + 32, "44 fits", size=12, color=GREEN)
    # the pages they really take
    y2 = y1 + 56
    s.text(x0 - 10, y2 + 22, "pages they take", size=12.5, anchor="end", muted=True)
    taken = [("r0", 0, ORANGE), ("r1", 1, PURPLE), ("r1", 2, PURPLE), ("r2", 3, GREEN)]
    for name, p, color in taken:
        x = x0 + p * 16 * sw
        over = p >= 3
        s.box(
            x + 2,
            y2,
            16 * sw - 4,
            34,
            RED if over else color,
            rx=5,
            fill_opacity=0.15 if over else 0.3,
            stroke_width=1.2,
            dashed=over,
        )
        s.text(x + 8 * sw, y2 + 22, name, size=12, anchor="middle", color=RED if over else None)
    s.line(x0 + 48 * sw, y2 - 8, x0 + 48 * sw, y2 + 42, color=RED, width=2)
    s.text(x0 + 64 * sw + 8, y2 + 16, "4 pages > 3:", size=12, color=RED)
    s.text(x0 + 64 * sw + 8, y2 + 32, "allocation fails", size=12, color=RED)
    # counted in whole pages (ours)
    y3 = y2 + 74
    s.text(x0 - 10, y3 + 22, "ours", size=12.5, anchor="end", bold=True)
    s.text(x0 - 10, y3 + 38, "whole pages", size=12, anchor="end", muted=True)
    ours = [("r0: 13 -> 16", 0, 1, ORANGE), ("r1: 20 -> 32", 1, 2, PURPLE)]
    for label, p, n, color in ours:
        x = x0 + p * 16 * sw
        s.box(x + 2, y3, n * 16 * sw - 4, 34, color, rx=5, fill_opacity=0.3, stroke_width=1.2)
        s.text(x + n * 8 * sw, y3 + 22, label, size=12, anchor="middle")
    s.box(
        x0 + 48 * sw + 2,
        y3,
        16 * sw - 4,
        34,
        RED,
        rx=5,
        fill_opacity=0.15,
        stroke_width=1.2,
        dashed=True,
    )
    s.text(x0 + 56 * sw, y3 + 22, "r2: 11 -> 16", size=12, anchor="middle", color=RED)
    s.line(x0 + 48 * sw, y3 - 8, x0 + 48 * sw, y3 + 42, color=None, width=2)
    s.text(
        x0,
        y3 + 62,
        "32 + 16 = 48 fits; 48 + 16 = 64 > 48: r2 waits for pages to come back, and r3 behind it.",
        size=12.5,
        muted=True,
    )
    s.text(
        20,
        505,
        "Each request may leave up to page_size - 1 slots of its last page empty; counting "
        "whole pages leaves room for that.",
        size=12.5,
        muted=True,
    )
    return s.render()
