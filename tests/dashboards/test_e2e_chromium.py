"""End to end: `trajlake dashboard` serves the real app; headless Chromium opens every page.

Needs Debian's `chromium` and `chromium-driver`; the `chromium` fixture installs them with
apt-get when they are missing. Screenshots go to $TRAJLAKE_ARTIFACTS_DIR (default: a tmp dir).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.dashboards.conftest import OTHER_RUN_ID, RUN_ID, append_trajectories, build_lake, trajectories_in
from trajlake.dashboards.app import PAGES

pytestmark = pytest.mark.integration

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
CHARTS_PER_PAGE = {
    "overview": 2,
    "entropy": 2,
    "behaviour": 5,
    "failures": 4,
    "async": 4,
    "compare": 3,
    "latency": 5,
    "health": 4,
    "rescore": 0,
    "browser": 0,
    "sql": 0,
}
READY_S = 120  # a cold Streamlit start on a busy 2-core machine
URL_QUERY = {"compare": f"&runs={RUN_ID},{OTHER_RUN_ID}"}
"""What a page's URL carries besides `?page=`."""


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium and its driver, installed with apt-get if missing."""
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        if shutil.which("apt-get") is None or os.geteuid() != 0:
            pytest.fail(
                "install Chromium: `apt-get install -y chromium chromium-driver` (needs root and apt)"
            )
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update"], check=True, env=env, capture_output=True)
        subprocess.run(
            ["apt-get", "install", "-y", "chromium", "chromium-driver"],
            check=True,
            env=env,
            capture_output=True,
        )
    return CHROMIUM


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve(root: str, tmp_path: Path) -> Iterator[str]:
    """`trajlake dashboard` on a free port, as a user starts it; yields its URL."""
    port = free_port()
    log = (tmp_path / "dashboard.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from trajlake.cli import run; run()", "dashboard", "--lake", root,
         "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + READY_S
        while True:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).text == "ok":
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the dashboard did not come up:\n{(tmp_path / 'dashboard.log').read_text()}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture
def dashboard(two_runs_lake, tmp_path) -> Iterator[str]:
    """The app over a lake of two runs, so that the comparison has something to compare."""
    with serve(two_runs_lake.root, tmp_path) as url:
        yield url


@pytest.fixture
def browser(chromium, tmp_path, monkeypatch) -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    monkeypatch.setenv("SE_OFFLINE", "true")  # never let selenium-manager fetch anything
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--no-first-run",
        f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1600,1400",
    ):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def artifacts(tmp_path) -> Path:
    path = Path(os.environ.get("TRAJLAKE_ARTIFACTS_DIR") or tmp_path / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def open_page(browser, url: str, page: str) -> None:
    """Open a page of the app and wait until its script run ended and its charts are drawn."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{url}/?page={page}{URL_QUERY.get(page, '')}")
    wait = WebDriverWait(browser, READY_S)
    title = PAGES[page][0]
    wait.until(lambda d: any(h.text == title for h in d.find_elements(By.CSS_SELECTOR, "h2")))
    want = CHARTS_PER_PAGE[page]
    wait.until(
        lambda d: len(d.find_elements(By.CSS_SELECTOR, ".vega-embed canvas, .vega-embed svg.marks")) >= want
    )
    # Streamlit swaps stale elements out once the script run ends; wait for it to finish.
    wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]'))


def test_every_page_opens_in_chromium_with_its_charts(dashboard, browser, artifacts):
    from selenium.webdriver.common.by import By

    for page in PAGES:
        open_page(browser, dashboard, page)
        exceptions = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
        assert not exceptions, f"page {page}: {[e.text for e in exceptions]}"
        browser.save_screenshot(str(artifacts / f"{page}.png"))
        assert (artifacts / f"{page}.png").stat().st_size > 10_000
        if page == "compare":  # both runs picked, and still in the URL
            tags = browser.find_element(By.CSS_SELECTOR, '[data-testid="stMultiSelectTagsContainer"]')
            assert tags.text.split("\n") == [RUN_ID, OTHER_RUN_ID]
            assert f"runs={RUN_ID}%2C{OTHER_RUN_ID}" in browser.current_url


CUT_TEXT = """
const cut = [];
const page = document.querySelector('[data-testid="stMain"]').getBoundingClientRect();
function shown(el) {  // the box an element can show: its clipping ancestors' within its element, and the page's width
  const box = {left: page.left, top: -1e9, right: page.right, bottom: 1e9};
  for (let a = el.parentElement; a; a = a.parentElement) {
    const s = getComputedStyle(a), r = a.getBoundingClientRect();
    if (['hidden', 'clip'].includes(s.overflowX)) { box.left = Math.max(box.left, r.left); box.right = Math.min(box.right, r.right); }
    if (['hidden', 'clip'].includes(s.overflowY)) { box.top = Math.max(box.top, r.top); box.bottom = Math.min(box.bottom, r.bottom); }
    if (a.getAttribute('data-testid') === 'stElementContainer') break;
  }
  return box;
}
for (const el of document.querySelectorAll('[data-testid="stMetricLabel"] *, [data-testid="stMetricValue"] *')) {
  if (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX !== 'visible') cut.push('tile: ' + el.textContent);
}
const ruler = document.createElement('canvas').getContext('2d');
const lines = [...document.querySelectorAll('.vega-embed svg text')].flatMap(t => {
  const spans = [...t.querySelectorAll('tspan')];
  return spans.length ? spans : [t];
});
for (const t of lines) {
  const text = t.textContent.trim();
  if (!text || t.closest('[opacity="0"]')) continue;  // a label Vega hid to avoid an overlap
  if (text.endsWith('\u2026') || text.startsWith('\u2026')) { cut.push('chart: ' + text); continue; }
  // a line's box is its font's em box and advance; its ink, measured, is what must show
  const s = getComputedStyle(t), r = t.getBoundingClientRect(), b = shown(t);
  ruler.font = `${s.fontStyle} ${s.fontWeight} ${s.fontSize} ${s.fontFamily}`;
  const m = ruler.measureText(text), rotated = text.length > 1 && r.height > r.width;
  const over = m.fontBoundingBoxAscent - m.actualBoundingBoxAscent;  // em box above the ink
  const high = m.actualBoundingBoxAscent + m.actualBoundingBoxDescent;
  const along = rotated ? r.height : r.width, scale = m.width ? along / m.width : 1;
  const start = -m.actualBoundingBoxLeft * scale, end = m.actualBoundingBoxRight * scale;  // ink along the line
  const [left, right] = rotated ? [r.left + over, r.left + over + high] : [r.left + start, r.left + end];
  const [top, bottom] = rotated ? [r.bottom - end, r.bottom - start] : [r.top + over, r.top + over + high];
  if (r.width && (left < b.left - 1 || right > b.right + 1 || top < b.top - 1 || bottom > b.bottom + 1)) {
    cut.push('chart, outside its box: ' + text);
  }
}
return cut;
"""
"""Text the page does not show whole: a tile's label or value cut by an ellipsis, a chart's text
that Vega shortened ('…', also its '…N entries' of a legend too long) or that lies outside the
boxes that clip it (the chart's, the page's width)."""
SETTLE_S = 15
"""How long a page may take to lay its charts out at a new width before cut text counts."""


@pytest.mark.parametrize("width", [1400, 1000])
def test_no_title_label_or_legend_is_cut_off_at_common_widths(dashboard, browser, artifacts, width):
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    browser.set_window_size(width, 1400)
    for page in PAGES:
        open_page(browser, dashboard, page)
        try:  # Vega lays charts out again as the page settles: wait for a clean layout
            WebDriverWait(browser, SETTLE_S, poll_frequency=0.5).until(
                lambda d: not d.execute_script(CUT_TEXT)
            )
        except TimeoutException:
            browser.save_screenshot(str(artifacts / f"cut-{page}-{width}.png"))
            pytest.fail(f"page {page} at {width} px cuts off: {browser.execute_script(CUT_TEXT)}")


def test_trajectory_browser_shades_tokens_in_chromium(dashboard, browser, artifacts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{dashboard}/?page=browser")
    wait = WebDriverWait(browser, READY_S)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "span.tok")) > 10)
    shaded = [s.get_attribute("style") for s in browser.find_elements(By.CSS_SELECTOR, "span.tok")]
    assert any("rgba(214, 39, 40" in s for s in shaded)  # sampled tokens, shaded by logprob
    browser.save_screenshot(str(artifacts / "browser-tokens.png"))


def test_the_latency_pages_link_opens_the_slowest_trajectory_in_the_browser(
    two_runs_lake, dashboard, browser
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    from trajlake.dashboards.metrics import slowest_trajectories
    from trajlake.dashboards.views.latency import browser_link

    slowest = slowest_trajectories(two_runs_lake, RUN_ID, limit=1).column("trajectory_id")[0].as_py()
    browser.get(f"{dashboard}/{browser_link(RUN_ID, slowest)}")
    wait = WebDriverWait(browser, READY_S)
    wait.until(
        lambda d: any(h.text == f"Trajectory {slowest}" for h in d.find_elements(By.CSS_SELECTOR, "h3"))
    )
    assert f"trajectory={slowest}" in browser.current_url
    assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')


def test_live_view_shows_new_trajectories_without_a_click(browser, tmp_path, artifacts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    lake = build_lake(tmp_path / "lake", trajectories=32, trainer=False)

    def shown(d) -> str:
        metrics = [m.text for m in d.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]')]
        return next((t.split("\n")[-1] for t in metrics if t.startswith("Trajectories")), "")

    with serve(lake.root, tmp_path) as url:
        browser.get(f"{url}/?page=overview&live=2")
        wait = WebDriverWait(browser, READY_S)
        before = trajectories_in(lake)
        wait.until(lambda d: shown(d) == f"{before:,}")
        append_trajectories(lake, 16, seed=1)  # a running job commits more; nobody clicks
        after = trajectories_in(lake)
        assert after > before
        wait.until(lambda d: shown(d) == f"{after:,}")
        assert "live=2" in browser.current_url
        assert not browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
        browser.save_screenshot(str(artifacts / "live.png"))
