"""Drive JupyterLab in a real browser (headless Chromium through selenium and the system chromedriver).

The harness the browser tests share: start JupyterLab on a free loopback port with a token, over a
throw-away copy of the course (the repository is never written), open a notebook, Run All, wait for the
kernel, save, and read back what the page shows: cell errors, widget outputs, widget-load failures,
console errors, and the HTML a widget's board shows before and after its slider moves.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat
from patience import HANG_GUARD_S

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
DRIVERS = ("chromedriver",)

# Text JupyterLab's widget manager shows when a widget cannot render, and the plain-text fallback a widget
# output falls back to when no widget manager is installed at all (e.g. "VBox(children=(...))").
WIDGET_FAILURE_TEXTS = ("Error displaying widget", "Loading widget...", "Failed to load model class",
                        "Could not create a view", "model not found", "Click to show javascript error")
# A course widget's own fallback (labs/views/text_view.py) starts with "Text view of ".
WIDGET_FALLBACK_PREFIXES = ("VBox(", "HBox(", "IntSlider(", "HTML(value", "Output(", "Play(", "ViewBox(",
                            "Text view of ")

# Console messages at SEVERE level that are not the course's: the browser asks for a favicon the server
# does not have. Everything else at SEVERE fails a test.
BENIGN_CONSOLE = ("favicon.ico",)

# Run All is asked again through the command palette if no cell has started this long after the menu click.
RETRY_RUN_ALL_AFTER_S = 30.0

WIDGET_OUTPUT_MIME = "application/vnd.jupyter.widget-view+json"


def find_browser() -> tuple[str, str] | str:
    """(browser, chromedriver) paths, or the reason the browser tests must skip."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (bash scripts/setup.sh installs it)"
    browser = next((shutil.which(name) for name in BROWSERS if shutil.which(name)), None)
    driver = next((shutil.which(name) for name in DRIVERS if shutil.which(name)), None)
    if browser is None or driver is None:
        return ("no Chromium and chromedriver on PATH (Debian/Ubuntu: `apt-get install chromium "
                "chromium-driver`; scripts/setup.sh does it where apt-get is available as root)")
    return browser, driver


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _write_settings(settings_dir: Path) -> None:
    """User settings for this JupyterLab only: every cell kept in the page (no windowing, so every output
    can be inspected) and no news or update checks (they would reach for the network)."""
    files = {
        ("@jupyterlab", "notebook-extension", "tracker.jupyterlab-settings"): {"windowingMode": "none"},
        ("@jupyterlab", "apputils-extension", "notification.jupyterlab-settings"):
            {"fetchNews": "false", "checkForUpdates": False},
    }
    for parts, value in files.items():
        path = settings_dir.joinpath(*parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value), encoding="utf-8")


@dataclass
class JupyterLab:
    """A running JupyterLab server over `root` (a copy of the course)."""

    root: Path
    url: str
    token: str
    process: subprocess.Popen
    log_path: Path

    def api(self, method: str, path: str) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=HANG_GUARD_S) as response:
            body = response.read()
        return json.loads(body) if body else None

    def shutdown_kernels(self) -> None:
        """End every notebook session, so one phase's kernel does not hold memory during the next."""
        for session in self.api("GET", "/api/sessions"):
            self.api("DELETE", f"/api/sessions/{session['id']}")

    def log_tail(self, num_lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-num_lines:])


def start_jupyterlab(repo_root: Path, workdir: Path, timeout_s: float = HANG_GUARD_S) -> JupyterLab:
    """Copy the course into `workdir` and start JupyterLab there (loopback only, token auth)."""
    root = workdir / "course"
    shutil.copytree(repo_root / "solutions", root / "solutions")
    shutil.copy(repo_root / "nbgrader_config.py", root / "nbgrader_config.py")
    settings = workdir / "lab-settings"
    _write_settings(settings)
    port, token = _free_port(), os.urandom(12).hex()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", JUPYTER_CONFIG_DIR=str(workdir / "config"),
               MPLBACKEND="module://matplotlib_inline.backend_inline")
    log_path = workdir / "jupyterlab.log"
    command = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
               f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
               f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={workdir / 'workspaces'}",
               "--LabApp.expose_app_in_browser=True"]  # window.jupyterapp: open the next notebook without a reload
    with log_path.open("w") as log:
        process = subprocess.Popen(command, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    lab = JupyterLab(root, f"http://127.0.0.1:{port}", token, process, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{lab.log_tail()}")
        try:
            lab.api("GET", "/api/status")
            return lab
        except OSError:
            time.sleep(0.5)
    process.terminate()
    raise RuntimeError(f"JupyterLab did not answer within {timeout_s:.0f} s:\n{lab.log_tail()}")


def start_browser(browser: str, driver: str) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1600",
                     "--disable-gpu"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def wait_for(condition: Callable[[], Any], timeout_s: float, what: str, poll_s: float = 0.25) -> Any:
    """Poll `condition` until it returns something truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


class NotebookPage:
    """One notebook open in JupyterLab, in its own workspace."""

    def __init__(self, lab: JupyterLab, browser: Any, relative_path: str):
        self.lab, self.browser, self.path = lab, browser, relative_path
        self.browser.get_log("browser")  # drop what earlier pages logged
        self.dismiss_dialogs()  # one an earlier test left open would block every command that follows
        if self.js("return typeof window.jupyterapp === 'object' && window.location.href.includes('/lab');"):
            # JupyterLab is already loaded: close every tab and open this notebook in place (a full page load
            # per notebook costs seconds of JavaScript start-up on 2 cores).
            # Tabs are closed as unchanged: a notebook an earlier test could not save would otherwise ask
            # "save your work?" in a dialog that never gets an answer.
            self.js("const app = window.jupyterapp;"
                    "for (const w of [...app.shell.widgets('main')]) {"
                    "  if (w.context && w.context.model) { w.context.model.dirty = false; } }"
                    "app.commands.execute('application:close-all')"
                    "  .then(() => app.commands.execute('docmanager:open', {path: arguments[0]}));", relative_path)
        else:
            browser.get(f"{lab.url}/lab/workspaces/mini-browser-tests/tree/{relative_path}?reset&token={lab.token}")
        wait_for(lambda: self.current_path() == relative_path, HANG_GUARD_S, f"{relative_path} to open")
        wait_for(lambda: self.kernel_status() == "idle", HANG_GUARD_S, f"the kernel of {relative_path} to start")

    def current_path(self) -> str | None:
        return self.js("const app = window.jupyterapp; const w = app && app.shell.currentWidget;"
                       "return w && w.context ? w.context.path : null;")

    def js(self, script: str, *args: Any) -> Any:
        return self.browser.execute_script(script, *args)

    def dialog_text(self) -> str | None:
        """The text of JupyterLab's open modal dialog, or None."""
        return self.js("const d = document.querySelector('dialog.jp-Dialog');"
                       "return d ? d.innerText.replace(/\\s+/g, ' ').trim() : null;")

    def dismiss_dialogs(self) -> None:
        self.js("document.querySelectorAll('dialog.jp-Dialog').forEach(d => {"
                "  const b = d.querySelector('.jp-mod-reject') || d.querySelector('button');"
                "  if (b) { b.click(); } });")

    def press_dialog_button(self, label: str) -> bool:
        """Click the open dialog's button labelled `label`; False if there is none."""
        return bool(self.js("const d = document.querySelector('dialog.jp-Dialog');"
                            "const b = d && [...d.querySelectorAll('button')]"
                            "  .find(b => b.innerText.trim().toLowerCase() === arguments[0]);"
                            "if (b) { b.click(); return true; } return false;", label.lower()))

    def kernel_status(self) -> str | None:
        return self.js("const e = document.querySelector('.jp-Notebook-ExecutionIndicator');"
                       "return e && e.getAttribute('data-status');")

    def prompts(self) -> list[str]:
        return self.js("return [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]"
                       ".map(e => e.textContent.trim());")

    def menu(self, menu_label: str, command: str) -> None:
        from selenium.webdriver.common.by import By

        dialog = self.dialog_text()
        assert dialog is None, f"a JupyterLab dialog is open before {menu_label} > {command}: {dialog!r}"
        self.browser.find_element(
            By.XPATH, f"//div[contains(@class, 'lm-MenuBar-itemLabel') and text()='{menu_label}']").click()
        wait_for(lambda: self.browser.find_elements(By.CSS_SELECTOR, f"li[data-command='{command}']"),
                 HANG_GUARD_S, f"the menu item {command}")[0].click()

    def run_all(self, timeout_s: float) -> None:
        """Run > Run All Cells, then wait until every code cell has run and the kernel is idle."""
        self.menu("Run", "runmenu:run-all")

        def started() -> bool:
            return any(p != "[ ]:" for p in self.prompts())

        # Seen once on a busy 2-core CI run: the menu click was lost and no cell was queued. If nothing has
        # started after a while, nothing ran, so asking again through JupyterLab's own command is safe (and on
        # a merely slow machine it queues the cells twice, which ends the same way). A retry, not a limit.
        asked_again = False
        clicked = time.monotonic()
        while not started():
            if not asked_again and time.monotonic() - clicked > RETRY_RUN_ALL_AFTER_S:
                self.js("return window.jupyterapp.commands.execute('notebook:run-all-cells');")
                asked_again = True
            assert time.monotonic() - clicked < HANG_GUARD_S, f"Run All of {self.path} never started"
            time.sleep(0.25)

        def finished() -> bool:
            prompts = self.prompts()
            return (self.kernel_status() == "idle" and bool(prompts)
                    and all(p.startswith("[") and p[1:-2].isdigit() for p in prompts))

        wait_for(finished, timeout_s, f"Run All of {self.path} (prompts: {self.prompts()})", poll_s=0.5)

    def save_and_read(self) -> nbformat.NotebookNode:
        """File > Save, then the notebook as JupyterLab wrote it (outputs included)."""
        target = self.lab.root / self.path
        before = target.stat().st_mtime_ns
        self.menu("File", "docmanager:save")

        def saved() -> bool:
            # On a busy machine JupyterLab can take its own earlier write for a change on disk and ask
            # "File Changed: overwrite or revert?": the page's copy is the one under test, so overwrite.
            self.press_dialog_button("overwrite")
            if target.stat().st_mtime_ns == before:
                return False
            try:  # the new mtime comes with the write's start: wait until the whole notebook is there
                nbformat.read(str(target), as_version=4)
            except (ValueError, OSError):
                return False
            return True

        wait_for(saved, HANG_GUARD_S, f"{self.path} to be saved (dialog: {self.dialog_text()!r})")
        return nbformat.read(str(target), as_version=4)

    def page_text(self) -> str:
        return self.js("return document.querySelector('.jp-NotebookPanel').innerText;")

    def rendered_widget_outputs(self) -> int:
        """Outputs in which the widget manager drew a widget (a `.jupyter-widgets` element)."""
        return self.js("return [...document.querySelectorAll('.jp-OutputArea-output')]"
                       ".filter(o => o.querySelector('.jupyter-widgets')).length;")

    def error_widgets(self) -> int:
        """Widgets the manager replaced by its error placeholder (a view class that failed to load)."""
        return self.js("return document.querySelectorAll("
                       "'.jp-OutputArea-output .jupyter-widgets-error-widget').length;")

    def plain_text_outputs(self) -> list[str]:
        return self.js("return [...document.querySelectorAll('.jp-OutputArea-output pre')]"
                       ".map(e => e.textContent);")

    def console_errors(self) -> list[str]:
        return [entry["message"] for entry in self.browser.get_log("browser")
                if entry["level"] == "SEVERE" and not any(b in entry["message"] for b in BENIGN_CONSOLE)]

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.browser.save_screenshot(str(path))

    # ------------------------------------------------------------------ slider widgets
    def slider_widgets(self) -> list[Any]:
        """Every widget box holding a slider and an HTML board (the course's step-replay widgets)."""
        from selenium.webdriver.common.by import By

        boxes = self.browser.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output .widget-vbox")
        return [box for box in boxes
                if box.find_elements(By.CSS_SELECTOR, ".widget-hslider")
                and box.find_elements(By.CSS_SELECTOR, ".widget-html-content")]

    def slider_state(self, box: Any) -> tuple[str, str]:
        """(the slider's readout, the board's HTML) of one widget box."""
        return self.js(
            "const box = arguments[0];"
            "return [box.querySelector('.widget-hslider .widget-readout').textContent.trim(),"
            "        box.querySelector('.widget-html-content').innerHTML];", box)

    def press_on_slider(self, box: Any, key: str) -> tuple[str, str]:
        """Focus the slider's handle, press `key` (e.g. Keys.ARROW_RIGHT), wait for the readout to change,
        then for the board to settle; return the new (readout, board HTML)."""
        from selenium.webdriver.common.by import By

        readout, board = self.slider_state(box)
        handle = box.find_element(By.CSS_SELECTOR, ".widget-hslider .noUi-handle")
        self.js("arguments[0].scrollIntoView({block: 'center'});", box)
        handle.click()
        handle.send_keys(key)
        wait_for(lambda: self.slider_state(box)[0] != readout, HANG_GUARD_S, "the slider's readout to move")
        wait_for(lambda: self.slider_state(box)[1] != board, HANG_GUARD_S,
                 "the board to redraw after the slider moved (the kernel answers the slider's change)")
        time.sleep(0.3)
        return self.slider_state(box)
