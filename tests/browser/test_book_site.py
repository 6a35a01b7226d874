"""The built book in headless Chromium: every page loads with no console error and every image renders,
the navigation reaches every page, the search box finds a phase and leads to it, and every internal link
and anchor resolves. The site is built here (the Mini build executed for phase 01 only: CI's budget) and
served from a loopback HTTP server."""

from __future__ import annotations

import functools
import http.server
import threading
from urllib.parse import unquote, urldefrag

import pytest
from patience import HANG_GUARD_S

from book.build import build
from book.pages import all_pages
from tests.browser.lab_page import BENIGN_CONSOLE, wait_for


@pytest.fixture(scope="module")
def site_url(browser_paths, tmp_path_factory):
    out = tmp_path_factory.mktemp("book") / "site"
    build(out, execute="01", cache_dir=out.parent / "cache", log=lambda line: None)
    handler = functools.partial(_QuietHandler, directory=str(out))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/"
    _SITE_DIRS[url] = out
    yield url
    server.shutdown()
    thread.join()


_SITE_DIRS: dict = {}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def _open(browser, url: str) -> None:
    browser.get(url)
    wait_for(lambda: browser.execute_script("return document.readyState") == "complete", HANG_GUARD_S,
             f"{url} to load")


def _console_errors(browser) -> list[str]:
    return [e["message"] for e in browser.get_log("browser")
            if e["level"] == "SEVERE" and not any(b in e["message"] for b in BENIGN_CONSOLE)]


def _page_problems(browser, site_url: str, url: str) -> list[str]:
    _open(browser, site_url + url)
    problems = [f"{url}: not served"] if browser.title.startswith("Error response") else []
    broken_images = browser.execute_script(
        "return Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src);")
    problems += [f"{url}: image does not render: {src}" for src in broken_images]
    return problems + [f"{url}: console: {message}" for message in _console_errors(browser)]


def test_every_page_loads_without_console_errors_and_its_images_render(browser, site_url):
    browser.get_log("browser")
    problems = [problem for page in all_pages() for problem in _page_problems(browser, site_url, page.url)]
    assert not problems, problems
    _open(browser, site_url + "phases/01_paged_kv.html")
    assert browser.execute_script("return document.images.length") > 0, "the executed phase shows its pictures"


def test_the_navigation_reaches_every_page(browser, site_url):
    _open(browser, site_url + "index.html")
    linked = browser.execute_script("return Array.from(document.querySelectorAll('nav.side a')).map(a => a.href);")
    assert {url.removeprefix(site_url) for url in linked} == {p.url for p in all_pages()}
    browser.find_element("css selector", "nav.side a[href='phases/05_scheduler.html']").click()
    wait_for(lambda: browser.current_url.endswith("phases/05_scheduler.html"), HANG_GUARD_S, "phase 05 to open")
    assert "scheduler" in browser.find_element("css selector", "main h1").text.lower()
    current = browser.find_element("css selector", "nav.side a.current").get_attribute("href")
    assert current.endswith("phases/05_scheduler.html")
    browser.find_element("css selector", "nav.pager a[rel='next']").click()
    wait_for(lambda: browser.current_url.endswith("phases/06_engine_loop.html"), HANG_GUARD_S, "the next page")


def test_the_search_box_finds_a_phase_and_leads_to_it(browser, site_url):
    _open(browser, site_url + "docs/index.html")
    box = browser.find_element("css selector", "#search-input")
    box.click()
    box.send_keys("slot_mapping flat batch")
    results = wait_for(lambda: browser.find_elements("css selector", "#search-results li a"), HANG_GUARD_S,
                       "search results")
    targets = [a.get_attribute("href") for a in results]
    assert any("phases/02_slot_mapping.html" in t for t in targets), targets
    results[0].click()
    wait_for(lambda: browser.current_url != site_url + "docs/index.html", HANG_GUARD_S, "the result to open")
    assert not _console_errors(browser)


def test_every_internal_link_and_anchor_resolves(browser, site_url):
    targets: set[str] = set()
    for page in all_pages():
        _open(browser, site_url + page.url)
        targets |= set(browser.execute_script(
            "return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"
            ".filter(h => h.startsWith(location.origin));"))
    assert len(targets) > 300      # every page, and every heading's link to itself
    broken = []
    for target in sorted(targets):
        url, anchor = urldefrag(target)
        anchor = unquote(anchor)       # the browser gives a.href percent-encoded; an id is the plain text
        _open(browser, target)
        if browser.title.startswith("Error response"):
            broken.append(f"{url}: not found")
        elif anchor and not browser.execute_script("return document.getElementById(arguments[0]) !== null;", anchor):
            broken.append(f"{target}: no such anchor")
    assert not broken, broken


def test_a_broken_image_and_a_console_error_are_caught(browser, site_url):
    page = _SITE_DIRS[site_url] / "broken.html"
    page.write_text('<!DOCTYPE html><html><head><title>broken</title></head><body><img src="missing.png">'
                    "<script>console.error('deliberate');</script></body></html>", encoding="utf-8")
    browser.get_log("browser")
    problems = _page_problems(browser, site_url, "broken.html")
    page.unlink()
    assert any("image does not render" in p for p in problems) and any("deliberate" in p for p in problems)
