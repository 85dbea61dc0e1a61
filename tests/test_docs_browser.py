"""The documentation as a reader sees it: every built page, opened in headless Chromium.

``sphinx -W`` and a text search can't see what the theme draws itself: furo, for one, paints a
red "ERROR: Adding a table of contents ... is unnecessary" box over every ``.. contents::``
with CSS generated content. So each page of the session's build (``built_docs``) is served on a
loopback port and opened in a real browser, which must find:

- nothing the theme marks as an error: no ``::before`` / ``::after`` content that says
  "error" (read from the computed styles), no docutils system message or problematic node;
- no text running past the right edge of the column (a literal too long to wrap);
- no error in the browser's console (a site icon included: browsers ask for one);
- every image and picture loaded (the Graphviz SVGs included), and every internal link pointing
  to a page that exists and, with a ``#fragment``, to an id on that page;
- nothing fetched from anywhere but the page's own server;
- on the pages that carry them, the pictures drawn at build time, each with what it must show.

The site's search is tried once, and a page made for the purpose shows that each check fails on
what it is meant to catch.

A screenshot of the top of each page, and one of each picture, is kept for a person to look at:
under ``RESILIENCE_DOCS_SHOTS`` when set, else in the test session's temporary directory; the
path is printed.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from tests.support.browser import chrome, missing_browser
from tests.support.waiting import wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(420),
    # A contributor without Chromium skips; CI, where ./scripts/test installs it, fails instead.
    pytest.mark.skipif(
        missing_browser() is not None and not os.environ.get("CI"), reason=missing_browser() or ""
    ),
]

DOCS = Path(__file__).resolve().parent.parent / "docs"
#: The pages written in ``docs/``, and the ones Sphinx adds.
PAGES = [*sorted(p.stem for p in DOCS.glob("*.rst")), "genindex", "py-modindex", "search"]

#: The pictures drawn at build time: page -> {graph name: words the picture must show}.
PICTURES: dict[str, dict[str, tuple[str, ...]]] = {
    "concepts": {
        "delivery": ("admission", "retry_on", "park_on", "SUCCESS", "FAILURE", "drain", "replay"),
        "breaker_states": (
            "closed",
            "open",
            "half_open",
            "forced_open",
            "forced_closed",
            "failure_threshold",
            "failure_rate_threshold",
            "minimum_calls",
            "open_timeout",
            "a probe failed",
            "every probe succeeded",
            "force_open()",
            "force_closed()",
            "reset()",
        ),
        "entry_states": ("parked", "claimed by a drain", "lease", "dead", "removed"),
    },
    "design": {"layers": ("surfaces", "use cases", "runtime", "stores", "leaves")},
}

#: In the page: everything the browser can tell about it that a reader would notice.
INSPECT = """
const problems = [];
const describe = (el) => {
    const classes = typeof el.className === 'string' ? el.className.trim().split(/\\s+/) : [];
    return el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
        + classes.filter(Boolean).map((name) => '.' + name).join('');
};
for (const el of document.querySelectorAll('*')) {
    for (const pseudo of ['::before', '::after']) {
        const content = getComputedStyle(el, pseudo).content;
        if (content && /error/i.test(content)) {
            problems.push(`${describe(el)}${pseudo} draws ${content.slice(0, 120)}`);
        }
    }
}
for (const el of document.querySelectorAll('.system-message, .problematic')) {
    problems.push(`${describe(el)}: ${el.textContent.trim().slice(0, 120)}`);
}
// Text past the right edge of the column: a literal too long to wrap. Code blocks and tables
// scroll on their own, and the permalink sign of a heading or a signature hangs outside on
// purpose.
const article = document.querySelector('article');
const edge = article ? article.getBoundingClientRect().right + 1 : Infinity;
for (const el of article ? article.querySelectorAll('*') : []) {
    if (el.closest('pre, .highlight, .table-wrapper, table, h1, h2, h3, h4, h5, h6, .sig')) {
        continue;
    }
    const box = el.getBoundingClientRect();
    if (box.width && box.right > edge) {
        problems.push(`past the column's edge: ${describe(el)} ${el.textContent.slice(0, 80)}`);
    }
}
for (const img of document.images) {
    if (!img.complete || img.naturalWidth === 0) {
        problems.push(`image not loaded: ${img.currentSrc || img.src}`);
    }
}
const pictures = [];
for (const obj of document.querySelectorAll('object')) {
    const svg = obj.contentDocument && obj.contentDocument.documentElement;
    const box = obj.getBoundingClientRect();
    if (!svg || svg.tagName.toLowerCase() !== 'svg' || box.width === 0 || box.height === 0) {
        problems.push(`picture not shown: ${obj.data}`);
        continue;
    }
    const title = svg.querySelector('g > title');
    pictures.push({
        name: title ? title.textContent : '',
        text: svg.textContent,
        url: obj.data,
        width: box.width,
        natural: svg.width.baseVal.value,
    });
}
const loaded = performance.getEntriesByType('resource').map((entry) => entry.name);
const links = [...document.querySelectorAll('a[href]')].map((a) => a.href);
const ids = [...document.querySelectorAll('[id]')].map((el) => el.id);
return {problems, pictures, loaded, links, ids, title: document.title};
"""


#: Where each picture is on the page, with its caption: page coordinates for a screenshot.
FIGURE_BOXES = """
return [...document.querySelectorAll('object')].map((obj) => {
    const r = (obj.closest('figure') || obj).getBoundingClientRect();
    const [x, y] = [r.left + window.scrollX, r.top + window.scrollY];
    return {x: x, y: y, width: r.width, height: r.height};
});
"""


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in ("id", "name") and value:
                self.ids.add(value)


@functools.cache
def ids_in(path: Path) -> frozenset[str]:
    """The ids (and ``name`` anchors) of a built page, read from its file."""
    parser = _Ids()
    parser.feed(path.read_text(errors="replace"))
    return frozenset(parser.ids)


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Site:
    """The built docs served over HTTP on a loopback port, as a reader's host would serve them."""

    root: Path
    origin: str

    def url(self, page: str) -> str:
        return f"{self.origin}/{page}.html"

    def file_of(self, url: str) -> Path | None:
        """The file a same-origin URL names, or ``None`` for another origin."""
        parts = urlsplit(url)
        if f"{parts.scheme}://{parts.netloc}" != self.origin:
            return None
        path = self.root / unquote(parts.path).lstrip("/")
        return path / "index.html" if path.is_dir() else path


@pytest.fixture(scope="module")
def site(built_docs: Path) -> Iterator[Site]:
    handler = functools.partial(_QuietHandler, directory=str(built_docs))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Site(built_docs, f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    configured = os.environ.get("RESILIENCE_DOCS_SHOTS")
    where = Path(configured) if configured else tmp_path_factory.mktemp("docs-screenshots")
    where.mkdir(parents=True, exist_ok=True)
    return where


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    driver = chrome(tmp_path_factory.mktemp("chromium-profile"))
    driver.set_page_load_timeout(120)
    try:
        yield driver
    finally:
        driver.quit()


@dataclass
class Reading:
    """What the browser found on one page."""

    problems: list[str]
    pictures: list[dict[str, Any]]


def read_page(browser: Any, site: Site, page: str, shots: Path) -> Reading:
    """Open ``page``, take its screenshots, and list what a reader would find wrong."""
    browser.get_log("browser")  # what earlier pages left in the console is theirs
    browser.get(site.url(page))
    found = browser.execute_script(INSPECT)
    problems = list(found["problems"])
    for entry in browser.get_log("browser"):
        if entry["level"] == "SEVERE":
            problems.append(f"console: {entry['message']}")
    for url in found["loaded"]:
        if not url.startswith((site.origin + "/", "data:", "blob:")):
            problems.append(f"fetched from elsewhere: {url}")
    problems += broken_links(site, found["links"])

    stem = re.sub(r"[^\w-]+", "-", page)
    browser.save_screenshot(str(shots / f"{stem}.png"))
    for number, box in enumerate(browser.execute_script(FIGURE_BOXES), 1):
        # Through the DevTools protocol, by page coordinates: Selenium's element screenshot
        # waits for a frame that a headless Chromium may never draw for an embedded SVG.
        clip = {**box, "scale": 1}
        shot = browser.execute_cdp_cmd(
            "Page.captureScreenshot",
            {"format": "png", "captureBeyondViewport": True, "clip": clip},
        )
        (shots / f"{stem}-picture-{number}.png").write_bytes(base64.b64decode(shot["data"]))
    return Reading(problems, found["pictures"])


def broken_links(site: Site, links: list[str]) -> list[str]:
    broken = []
    for link in sorted(set(links)):
        path = site.file_of(link)
        if path is None:
            continue  # another site: a link a reader may follow, nothing the page loads
        if not path.is_file():
            broken.append(f"link to a missing page: {link}")
            continue
        fragment = unquote(urlsplit(link).fragment)
        if fragment and path.suffix == ".html" and fragment not in ids_in(path):
            broken.append(f"link to a missing anchor: {link}")
    return broken


@pytest.fixture(scope="module", autouse=True)
def _say_where_the_screenshots_are(shots: Path, request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    # Printed past pytest's capture: the path is for the person reading the run's output.
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is not None:
        with capture.global_and_fixture_disabled():
            print(f"\nscreenshots of the documentation's pages: {shots}")


@pytest.mark.parametrize("page", PAGES)
def test_the_page_reads_clean_in_a_browser(
    page: str, browser: Any, site: Site, shots: Path
) -> None:
    reading = read_page(browser, site, page, shots)
    assert not reading.problems, f"{page}.html in Chromium:\n" + "\n".join(reading.problems)
    expected = PICTURES.get(page, {})
    shown = {picture["name"]: picture for picture in reading.pictures}
    assert set(shown) == set(expected), f"{page}.html: pictures"
    for name, words in expected.items():
        text = " ".join(shown[name]["text"].split())
        missing = [word for word in words if word not in text]
        assert missing == [], f"{page}.html: the {name} picture lacks {missing}"
        # Drawn at its own size, or scaled down a little to fit the column: still legible.
        assert shown[name]["width"] >= 0.7 * shown[name]["natural"], f"{name} is squeezed"


def test_the_generated_source_pages_read_clean(
    built_docs: Path, browser: Any, site: Site, shots: Path
) -> None:
    """The pages Sphinx makes itself (highlighted module sources): every one that is not one of
    the pages above, so that no page of the build goes unread."""
    others = sorted(
        p.relative_to(built_docs).with_suffix("").as_posix()
        for p in built_docs.rglob("*.html")
        if p.relative_to(built_docs).with_suffix("").as_posix() not in PAGES
    )
    assert others, "the build has module source pages (sphinx.ext.viewcode)"
    assert all(page.startswith("_modules/") for page in others), others
    problems = [
        f"{page}.html: {problem}"
        for page in others
        for problem in read_page(browser, site, page, shots).problems
    ]
    assert not problems, "in Chromium:\n" + "\n".join(problems)


def test_a_search_finds_the_page_that_explains_a_word(browser: Any, site: Site) -> None:
    """The search box works from the files the site serves (its index is a script of the
    build): a reader searching for ``half_open`` gets the concepts page among the results."""
    browser.get(f"{site.url('search')}?q=half_open")

    def concepts_found() -> bool:
        found: list[str] = browser.execute_script(
            "return [...document.querySelectorAll('#search-results li a')].map((a) => a.href);"
        )
        return any(urlsplit(url).path == "/concepts.html" for url in found)

    wait_for(concepts_found, "concepts.html among the results", timeout=60, poll=0.1)


def test_the_checks_see_what_a_reader_would(browser: Any, site: Site, built_docs: Path) -> None:
    """On a page made for this test alone beside the built ones, with what the pages must not
    have: furo's box over a ``.. contents::``, a literal that runs past the column's edge, an
    image that does not load."""
    page = built_docs / "zz-probe.html"
    source = (built_docs / "index.html").read_text()
    bad = (
        '<nav class="contents local" id="probe"><ul><li>a</li></ul></nav>'
        f'<p><code style="white-space: nowrap">{"x" * 400}</code></p>'
        '<img src="_images/no-such-picture.svg" alt="missing">'
    )
    marker = '<article role="main" id="furo-main-content">'
    assert marker in source
    page.write_text(source.replace(marker, marker + bad, 1))
    try:
        browser.get(site.url("zz-probe"))
        problems = "\n".join(browser.execute_script(INSPECT)["problems"])
    finally:
        page.unlink()
    assert "ERROR: Adding a table of contents" in problems
    assert "past the column's edge: code xxxx" in problems
    assert "image not loaded: " in problems
