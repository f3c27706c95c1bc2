"""tools/browser.py: the site check sees what a reader would see, and fails on it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tools import browser

needs_chromium = pytest.mark.skipif(
    not (shutil.which("chromium") and shutil.which("chromedriver")),
    reason="needs Debian's chromium and chromium-driver (README: browser tests)",
)

GOOD_FIGURE = (
    '<div class="book-figure"><svg viewBox="0 0 400 100" style="width: 400px">'
    '<text x="10" y="50" font-size="14">fine</text></svg></div>'
)
PAGES = {
    "good": GOOD_FIGURE + "<pre><code>" + "x" * 60 + "</code></pre>",
    "script-error": "<script>undefined_function_of_the_page()</script>",
    "broken-image": '<img src="missing.png" alt="">',
    "tiny-text": '<div class="book-figure"><svg viewBox="0 0 400 100" style="width: 200px">'
    '<text x="10" y="50" font-size="14">tiny</text></svg></div>',
    "left-marker": '<p>--8<-- "docs/figures/x.svg"</p>',
    "wide-code": '<pre style="width: 300px"><code style="display: block; overflow: auto">'
    + "y" * 90
    + "</code></pre>",
}


def write_site(root: Path) -> None:
    for name, body in PAGES.items():
        folder = root / name
        folder.mkdir(parents=True)
        html = (
            '<!doctype html><html><body><div class="md-content"><div class="md-typeset">'
            f"{body}</div></div></body></html>"
        )
        (folder / "index.html").write_text(html)


@needs_chromium
def test_each_kind_of_problem_fails_its_page_and_only_its_page(tmp_path) -> None:
    write_site(tmp_path)
    pages = browser.site_pages(tmp_path)
    assert sorted(pages) == sorted(f"{name}/" for name in PAGES)
    with browser.serve(tmp_path) as base, browser.chromium() as driver:
        reports = browser.check_pages(driver, base, pages)
    by_page = {}
    for r in reports:
        if r.view == "desktop light":
            by_page[r.path.strip("/")] = " | ".join(r.problems)
    assert by_page["good"] == ""
    assert "browser error" in by_page["script-error"]
    assert "image did not load" in by_page["broken-image"]
    assert "smallest text 7.0 px" in by_page["tiny-text"]
    assert "include marker left in the page: --8<--" in by_page["left-marker"]
    assert "a code block of 90 columns scrolls sideways" in by_page["wide-code"]
    assert len(reports) == len(PAGES) * 4  # desktop and phone, light and dark


def test_without_chromium_the_tool_says_what_to_install(monkeypatch) -> None:
    monkeypatch.setattr(browser.shutil, "which", lambda name: None)
    monkeypatch.delenv("BOOK_CHROMIUM", raising=False)
    with pytest.raises(SystemExit, match="apt-get install chromium chromium-driver"):
        browser.chromium_paths()
