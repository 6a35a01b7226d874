"""Smoke test: `jupyter lab` starts on localhost and serves the learner notebooks in phases/.

The server is started with a random token on a free port, polled until it answers (bounded), asked for
the JupyterLab page and for a phase notebook through the contents API, then stopped."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from patience import HANG_GUARD_S

from labs.course.release import REPO_ROOT, list_assignments

STARTUP_TIMEOUT_S = HANG_GUARD_S


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=HANG_GUARD_S) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_jupyter_lab_serves_the_phase_notebooks(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp_path),
    }
    command = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={REPO_ROOT}",
        "--ServerApp.port_retries=0",
        "--allow-root",
    ]  # containers often run as root
    log_path = tmp_path / "jupyter.log"
    log = log_path.open("w")
    server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        status = None
        while time.monotonic() < deadline and server.poll() is None:
            try:
                status, _ = _get(f"{base}/api/status?token={token}")
                if status == 200:
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)
        assert status == 200, (
            f"jupyter lab did not start (exit code {server.poll()}):\n{log_path.read_text()}"
        )

        status, page = _get(f"{base}/lab?token={token}")
        assert status == 200 and b"JupyterLab" in page

        assignment_id = list_assignments()[0]
        status, body = _get(f"{base}/api/contents/phases/{assignment_id}/{assignment_id}.ipynb?token={token}")
        assert status == 200
        model = json.loads(body)
        assert model["type"] == "notebook"
        assert model["content"]["metadata"]["kernelspec"]["name"] == "python3"
        assert any("raise NotImplementedError()" in "".join(c["source"]) for c in model["content"]["cells"])

        status, _ = _get(f"{base}/api/contents/phases?token=wrong-token")
        assert status == 403  # the token is enforced
    finally:
        server.terminate()
        try:
            server.wait(timeout=HANG_GUARD_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
