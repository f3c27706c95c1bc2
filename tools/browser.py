"""The built site, read in a real browser (headless Chromium, driven by Selenium).

    python tools/browser.py check                  build the site, load every page, judge it
    python tools/browser.py screenshots --out DIR  every page at a desktop and a phone width

Each page is loaded at a desktop window (1440 x 900) and a phone (390 x 844), in the light
and the dark scheme. A page fails on: a message the browser logs as an error (a JavaScript
error, a resource that did not load), an image that did not load, a figure without its SVG or
whose smallest text shows below 12 px, an include marker left in the text, an animation that
does not step through all its frames (each with a picture and a narration), or (on the
desktop) a code block whose lines are at most 100 columns and that still scrolls sideways.

Chromium and its driver come from Debian's packages `chromium` and `chromium-driver` (the
README's set-up for the browser tests); $BOOK_CHROMIUM and $BOOK_CHROMEDRIVER name others.
"""

from __future__ import annotations

import argparse
import base64
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
DESKTOP, PHONE = (1440, 900), (390, 844)
CODE_COLUMNS = 100  # lines the book shows are at most this long (ruff's line length)
SMALLEST_TEXT_PX = 12
PAGE_SECONDS = 30
READY_SECONDS = 10.0  # how long a page's players may take to set themselves up

# What a page reports about itself, measured in the page by the browser.
MEASURE = """
const problems = [];
for (const img of document.querySelectorAll('img')) {
  if (!img.complete || img.naturalWidth === 0) problems.push('image did not load: ' + img.src);
}
const figures = [...document.querySelectorAll('.book-figure')];
for (const [i, fig] of figures.entries()) {
  const svg = fig.querySelector('svg');
  const texts = svg ? [...svg.querySelectorAll('text')] : [];
  if (!svg || texts.length === 0) {
    problems.push('figure ' + (i + 1) + ' has no SVG text');
    continue;
  }
  const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
  const smallest = Math.min(...texts.map(t => parseFloat(getComputedStyle(t).fontSize)));
  if (smallest * scale < arguments[0] - 0.05) {
    problems.push('figure ' + (i + 1) + ': smallest text ' + (smallest * scale).toFixed(1) + ' px');
  }
}
const text = document.querySelector('.md-content').innerText;
for (const marker of ['--8<--', '<!-- code', '<!-- tree', '<!-- roadmap']) {
  if (text.includes(marker)) problems.push('include marker left in the page: ' + marker);
}
if (arguments[1]) {
  for (const code of document.querySelectorAll('.md-typeset pre > code')) {
    if (!code.offsetParent) continue;  // inside a closed fold
    const longest = Math.max(...code.textContent.split('\\n').map(l => l.length));
    if (longest <= arguments[2] && code.scrollWidth > code.clientWidth + 1) {
      problems.push('a code block of ' + longest + ' columns scrolls sideways');
    }
  }
}
const animations = [...document.querySelectorAll('.book-animation')];
for (const [i, anim] of animations.entries()) {
  const total = parseInt(anim.dataset.frames || '0');
  const next = anim.querySelector("[data-act='next']");
  if (total < 2 || !next) { problems.push('animation ' + (i + 1) + ' did not start'); continue; }
  const seen = new Set();
  for (let step = 1; step <= total; step++) {
    const svg = anim.querySelector('.book-animation-stage svg');
    const said = anim.querySelector('.book-animation-narration').textContent;
    if (!svg || !svg.querySelector('text') || !said.trim()) {
      problems.push('animation ' + (i + 1) + ', frame ' + step + ': no picture or no narration');
    }
    seen.add(anim.dataset.frame);
    if (step < total) next.click();
  }
  if (seen.size !== total || anim.dataset.frame !== String(total)) {
    problems.push('animation ' + (i + 1) + ' stepped through ' + seen.size + ' of ' + total);
  }
  anim.querySelector("[data-act='first']").click();
}
return {problems: problems, figures: figures.length, animations: animations.length};
"""


@dataclass
class PageReport:
    path: str
    view: str
    problems: List[str]
    figures: int
    animations: int = 0


def chromium_paths() -> Tuple[str, str]:
    browser = os.environ.get("BOOK_CHROMIUM") or shutil.which("chromium") or ""
    driver = os.environ.get("BOOK_CHROMEDRIVER") or shutil.which("chromedriver") or ""
    if not (browser and driver):
        raise SystemExit(
            "browser tests need Chromium and its driver: apt-get install chromium chromium-driver "
            "(or set BOOK_CHROMIUM and BOOK_CHROMEDRIVER)"
        )
    return browser, driver


def build_site(out: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        check=True,
        timeout=600,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def site_pages(site: Path) -> List[str]:
    """Every page of the built site, as a URL path ('' is the home page)."""
    pages = []
    for index in sorted(site.rglob("index.html")):
        relative = index.parent.relative_to(site).as_posix()
        if relative.startswith(("assets", "search")):
            continue
        pages.append("" if relative == "." else relative + "/")
    return pages


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextmanager
def serve(site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def chromium() -> Iterator["object"]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(PAGE_SECONDS)
    driver.set_script_timeout(PAGE_SECONDS)
    try:
        yield driver
    finally:
        driver.quit()  # stops the browser and the driver, pass or fail


def set_view(driver, size: Tuple[int, int], scheme: str) -> None:
    driver.set_window_size(*size)
    features = [{"name": "prefers-color-scheme", "value": scheme}]
    driver.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": features})


def views() -> List[Tuple[str, Tuple[int, int], str]]:
    return [
        (f"{name} {scheme}", size, scheme)
        for name, size in (("desktop", DESKTOP), ("phone", PHONE))
        for scheme in ("light", "dark")
    ]


READY = """
return document.readyState === 'complete'
  && [...document.querySelectorAll('.book-animation')].every(a => a.dataset.frames);
"""


def wait_until_ready(driver, seconds: float = READY_SECONDS) -> None:
    """Wait (a bounded time) until the page has loaded and its players have set themselves up:
    on a busy machine a check run at once can find a player that has not started yet. What is
    still not ready afterwards, the check reports."""
    deadline = time.monotonic() + seconds
    while not driver.execute_script(READY) and time.monotonic() < deadline:
        time.sleep(0.1)


def check_pages(driver, base: str, pages: List[str]) -> List[PageReport]:
    reports = []
    for view, size, scheme in views():
        set_view(driver, size, scheme)
        for page in pages:
            driver.get_log("browser")  # drop what earlier pages logged
            driver.get(base + page)
            wait_until_ready(driver)
            measured: Dict = driver.execute_script(
                MEASURE, SMALLEST_TEXT_PX, size == DESKTOP, CODE_COLUMNS
            )
            problems = list(measured["problems"])
            for entry in driver.get_log("browser"):
                if entry.get("level") == "SEVERE":
                    problems.append(f"browser error: {entry.get('message')}")
            reports.append(
                PageReport(
                    page or "(home)", view, problems, measured["figures"], measured["animations"]
                )
            )
    return reports


def screenshot_pages(driver, base: str, pages: List[str], out: Path) -> List[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, size in (("desktop", DESKTOP), ("phone", PHONE)):
        set_view(driver, size, "light")
        for page in pages:
            driver.get(base + page)
            height = driver.execute_script("return document.documentElement.scrollHeight")
            shot = driver.execute_cdp_cmd(
                "Page.captureScreenshot",
                {
                    "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": size[0], "height": height, "scale": 1},
                },
            )
            target = out / f"{name}-{(page.strip('/') or 'home').replace('/', '-')}.png"
            target.write_bytes(base64.b64decode(shot["data"]))
            written.append(target)
    return written


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="The built site in a real browser.")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="load every page and fail on a problem")
    check.add_argument("--site", type=Path, help="an already built site (default: build it)")
    shots = sub.add_parser("screenshots", help="every page at a desktop and a phone width")
    shots.add_argument("--out", type=Path, required=True, help="a folder outside the repository")
    shots.add_argument("--site", type=Path, help="an already built site (default: build it)")
    args = parser.parse_args(argv)
    chromium_paths()  # say what is missing before building anything
    with tempfile.TemporaryDirectory(prefix="book-site-") as tmp:
        site = args.site
        if site is None:
            site = Path(tmp) / "site"
            build_site(site)
        pages = site_pages(site)
        if not pages:
            raise SystemExit(f"no pages in {site}: is it a built site?")
        with serve(site) as base, chromium() as driver:
            if args.command == "screenshots":
                written = screenshot_pages(driver, base, pages, args.out)
                print(f"{len(written)} screenshots of {len(pages)} pages in {args.out}")
                return 0
            reports = check_pages(driver, base, pages)
    failed = [r for r in reports if r.problems]
    desktop = [r for r in reports if r.view == "desktop light"]
    figures, animations = sum(r.figures for r in desktop), sum(r.animations for r in desktop)
    print(
        f"{len(pages)} pages x {len(views())} views ({', '.join(v[0] for v in views())}): "
        f"{len(reports) - len(failed)} of {len(reports)} clean; {figures} figures, "
        f"{animations} animations stepped through every frame"
    )
    for report in failed:
        for problem in report.problems:
            print(f"  {report.path} [{report.view}]: {problem}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
