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


def test_every_page_opens_in_chromium_with_its_charts(dashboard, browser, artifacts):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    for page, (title, _) in PAGES.items():
        browser.get(f"{dashboard}/?page={page}{URL_QUERY.get(page, '')}")
        wait = WebDriverWait(browser, READY_S)
        wait.until(lambda d, t=title: any(h.text == t for h in d.find_elements(By.CSS_SELECTOR, "h2")))
        want = CHARTS_PER_PAGE[page]
        wait.until(
            lambda d, n=want: (
                len(d.find_elements(By.CSS_SELECTOR, ".vega-embed canvas, .vega-embed svg.marks")) >= n
            )
        )
        # Streamlit swaps stale elements out once the script run ends; wait for it to finish.
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, '[data-testid="stStatusWidget"]'))
        exceptions = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stException"]')
        assert not exceptions, f"page {page}: {[e.text for e in exceptions]}"
        browser.save_screenshot(str(artifacts / f"{page}.png"))
        assert (artifacts / f"{page}.png").stat().st_size > 10_000
        if page == "compare":  # both runs picked, and still in the URL
            tags = browser.find_element(By.CSS_SELECTOR, '[data-testid="stMultiSelectTagsContainer"]')
            assert tags.text.split("\n") == [RUN_ID, OTHER_RUN_ID]
            assert f"runs={RUN_ID}%2C{OTHER_RUN_ID}" in browser.current_url


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
