"""The server's hardening options: request-template trust, template bounds, body size, shutdown, engine death.

Mirrors vllm/entrypoints/common/cli_args.py (`trust_request_chat_template`), vllm/engine/arg_utils.py
(`--shutdown-timeout`) and the environment variables vllm/envs.py reads for the rest; mini makes each a flag
of `python -m mini serve` with vLLM's default:

    --trust-request-chat-template    run a request's own `chat_template` (default: refuse it, 400)
    --chat-template-fuel N           template steps a request's own template may run (VLLM_CHAT_TEMPLATE_FUEL,
                                     500000; 0: no limit; mini/entrypoints/template_fuel.py)
    --chat-template-render-timeout S a render's wait bound (VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT, 30 s; 0: none)
    --max-request-body-size BYTES    larger bodies get 413 (VLLM_HTTP_MAX_REQUEST_BODY_SIZE, 32 MiB)
    --shutdown-timeout S             on SIGTERM/SIGINT, how long in-flight requests may finish (vLLM's flag:
                                     0, its default, aborts them at once)
    --keep-alive-on-engine-death     stay up answering 503 after the engine core died
                                     (VLLM_KEEP_ALIVE_ON_ENGINE_DEATH; default: exit with status 1)

Why a server may stay up after its core died: to be inspected (its /health, /metrics and logs) where no
supervisor restarts it. By default it exits non-zero, as vLLM's, so a supervisor (systemd, Kubernetes) sees
the failure and starts a fresh one instead of routing traffic to a server that can only answer 503.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from mini.entrypoints.template_fuel import DEFAULT_TEMPLATE_FUEL

DEFAULT_MAX_REQUEST_BODY_SIZE = 32 * 1024 * 1024     # vLLM's VLLM_HTTP_MAX_REQUEST_BODY_SIZE
DEFAULT_CHAT_TEMPLATE_RENDER_TIMEOUT_S = 30.0        # vLLM's VLLM_CHAT_TEMPLATE_RENDER_TIMEOUT
DEFAULT_SHUTDOWN_TIMEOUT_S = 0.0                     # vLLM's --shutdown-timeout (0: abort at once)


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """What `build_app` and `main` need beyond the engine (defaults: vLLM's)."""

    trust_request_chat_template: bool = False
    chat_template_fuel: int = DEFAULT_TEMPLATE_FUEL
    chat_template_render_timeout_s: float = DEFAULT_CHAT_TEMPLATE_RENDER_TIMEOUT_S
    max_request_body_size: int = DEFAULT_MAX_REQUEST_BODY_SIZE
    shutdown_timeout_s: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    keep_alive_on_engine_death: bool = False

    def __post_init__(self) -> None:
        for name in ("chat_template_fuel", "max_request_body_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.max_request_body_size == 0:
            raise ValueError("max_request_body_size must be at least 1 byte")
        for name in ("chat_template_render_timeout_s", "shutdown_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < float("inf"):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")


def add_serve_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="render a request's own chat_template (default: refuse such requests with 400)")
    parser.add_argument("--chat-template-fuel", type=int, default=DEFAULT_TEMPLATE_FUEL, metavar="N",
                        help="template steps a request's own chat template may run (0: no limit; "
                             f"default {DEFAULT_TEMPLATE_FUEL})")
    parser.add_argument("--chat-template-render-timeout", type=float, default=DEFAULT_CHAT_TEMPLATE_RENDER_TIMEOUT_S,
                        metavar="S", help="seconds a chat template render may take before its request gets 400 "
                                          f"(0: no limit; default {DEFAULT_CHAT_TEMPLATE_RENDER_TIMEOUT_S:g})")
    parser.add_argument("--max-request-body-size", type=int, default=DEFAULT_MAX_REQUEST_BODY_SIZE, metavar="BYTES",
                        help=f"larger request bodies get 413 (default {DEFAULT_MAX_REQUEST_BODY_SIZE}, 32 MiB)")
    parser.add_argument("--shutdown-timeout", type=float, default=DEFAULT_SHUTDOWN_TIMEOUT_S, metavar="S",
                        help="on SIGTERM/SIGINT, seconds in-flight requests may finish (default 0: abort them)")
    parser.add_argument("--keep-alive-on-engine-death", action="store_true",
                        help="keep serving (503) after the engine core died, for inspection "
                             "(default: exit with status 1 so a supervisor restarts the server)")
    return parser


def serve_options_from(args: argparse.Namespace) -> ServeOptions:
    return ServeOptions(
        trust_request_chat_template=args.trust_request_chat_template,
        chat_template_fuel=args.chat_template_fuel,
        chat_template_render_timeout_s=args.chat_template_render_timeout,
        max_request_body_size=args.max_request_body_size,
        shutdown_timeout_s=args.shutdown_timeout,
        keep_alive_on_engine_death=args.keep_alive_on_engine_death,
    )
