"""Fixtures of the browser suite: one JupyterLab server and one headless Chromium per test module.

Every test here is marked `browser`; where no Chromium, chromedriver or selenium is found the tests skip
with the reason (a learner's laptop); `bash scripts/setup.sh` installs them where apt-get runs as root.
Screenshots and the executed notebooks land in `test-artifacts/browser/` (git-ignored)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from patience import HANG_GUARD_S

from labs.course.release import REPO_ROOT
from tests.browser.lab_page import find_browser, start_browser, start_jupyterlab

ARTIFACTS = REPO_ROOT / "test-artifacts" / "browser"


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.browser)


@pytest.fixture(scope="module")
def browser_paths():
    found = find_browser()
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="module")
def lab(browser_paths, tmp_path_factory):
    server = start_jupyterlab(REPO_ROOT, tmp_path_factory.mktemp("jupyterlab"))
    yield server
    server.process.terminate()
    try:
        server.process.wait(timeout=HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        server.process.kill()


@pytest.fixture(scope="module")
def browser(browser_paths):
    driver = start_browser(*browser_paths)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def artifacts():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
