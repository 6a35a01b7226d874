"""The server process' life: stop signals during start-up, and the watchdog that ends it when its engine dies.

Mirrors vllm/entrypoints/launchers/launcher.py: its `watchdog_loop` / `terminate_if_errored` stop uvicorn once
the engine client has errored (unless VLLM_KEEP_ALIVE_ON_ENGINE_DEATH), and its signal handler starts the
shutdown. mini's `main` (mini/entrypoints/openai/api_server.py) returns exit status 1 after such a stop, so that
a supervisor sees the failure; vLLM's watchdog polls every 5 s, mini's every `WATCHDOG_POLL_S`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Any

from mini.engine.async_llm import AsyncLLM
from mini.engine.dp_client import engine_cores_alive

logger = logging.getLogger("mini.serve")

WATCHDOG_POLL_S = 0.5      # how often the watchdog checks the engine is alive


def engine_died(engine: AsyncLLM) -> bool:
    """True once the engine loop or any engine core has died (not when it was shut down)."""
    return engine.errored or not engine_cores_alive(engine)


def watch_engine(server: Any, engine: AsyncLLM, died: threading.Event, stop: StopSignals, keep_alive: bool,
                 poll_s: float = WATCHDOG_POLL_S) -> None:
    """Stop the server once its engine dies (vLLM's `watchdog_loop`, vllm/entrypoints/launchers/launcher.py;
    not with `keep_alive`), or once a stop signal came before uvicorn took the signals over."""
    while not server.should_exit:
        if stop.received is not None:
            server.should_exit = True
            return
        if not keep_alive and engine_died(engine):
            logger.error("the engine core died: stopping the server (--keep-alive-on-engine-death keeps it up)")
            died.set()
            server.should_exit = True
            return
        time.sleep(poll_s)


class StopSignals:
    """SIGTERM/SIGINT received outside uvicorn's own handling (start-up, the very end), remembered, not raised.

    Raising from a signal handler can land anywhere, even where Python swallows the exception ("Exception
    ignored in ... _releaseLock" when it lands in a fork hook): the server would then carry on. Instead start-up
    runs to its end and `main` shuts everything down at once, so that the engine core's process is stopped and
    its `/tmp/mini-engine-*` folder removed whenever the signal came. While serving, uvicorn handles the
    signals itself and re-raises them here once it has stopped."""

    def __init__(self) -> None:
        self.received: int | None = None

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)

    def on_signal(self, signum: int, frame: Any) -> None:
        if self.received is None:
            self.received = signum
