"""`python -m mini chat [MODEL]`: an interactive terminal chat that streams the reply token by token.

Mirrors vllm/entrypoints/cli/openai.py (`vllm chat`, which keeps the conversation and streams each
reply from a running server). mini has no server in between: it drives the same engine loop a server
would, `llm.llm_engine.add_request(...)` then `step()` until the request finishes, with
`output_kind=DELTA` so each step's RequestOutput carries only the text that is new since the last one.

Type a message and press Enter; `/reset` clears the history, `/exit` (or Ctrl-D, end of input) quits.
The default model is SmolLM2-135M-Instruct when its package is installed, else the shipped tiny model
(which has no chat template and only writes Python-like text: it shows the mechanism, not a chat).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable
from typing import Any, TextIO

from mini.config import add_engine_arguments, cli_engine_args
from mini.entrypoints.chat_utils import apply_chat_template
from mini.entrypoints.llm import LLM
from mini.model.registry import default_chat_model
from mini.sampling_params import RequestOutputKind, SamplingParams

EXIT_COMMANDS = ("/exit", "/quit")
RESET_COMMAND = "/reset"
_request_ids = itertools.count()
# The engine arguments `chat` takes, each generated from its EngineConfig field (mini/config.py).
CHAT_ENGINE_ARGS = ("seed", "max_model_len", "device", "dtype", "attention_backend", "enforce_eager")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mini chat", description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None,
                        help="local HF folder, .gguf file or offline hub id (default: SmolLM2-135M-Instruct "
                             "if installed, else the shipped tiny model)")
    parser.add_argument("--system", default=None, help="a system message to start the conversation with")
    parser.add_argument("--max-tokens", type=int, default=256, help="longest reply, in tokens")
    parser.add_argument("--temperature", type=float, default=0.2, help="0 = greedy (default 0.2, as SmolLM2's card)")
    parser.add_argument("--top-p", type=float, default=0.9)
    add_engine_arguments(parser, CHAT_ENGINE_ARGS)   # --seed seeds the sampling too
    return parser


def stream_reply(llm: Any, conversation: list[dict[str, str]], params: SamplingParams,
                 write: Callable[[str], Any]) -> str:
    """Add the rendered conversation to the engine, step it, `write` each new piece; -> the whole reply."""
    tokenizer = llm.get_tokenizer()
    prompt = apply_chat_template(tokenizer, conversation, add_generation_prompt=True)
    request_params = params.clone()
    request_params.output_kind = RequestOutputKind.DELTA
    engine = llm.llm_engine
    request_id = f"chat-{next(_request_ids)}"
    engine.add_request(request_id, {"prompt": prompt,
                                    "prompt_token_ids": tokenizer.encode(prompt, add_special_tokens=False)},
                       request_params)
    pieces: list[str] = []
    try:
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.request_id == request_id and output.outputs[0].text:
                    pieces.append(output.outputs[0].text)
                    write(output.outputs[0].text)
    except KeyboardInterrupt:  # Ctrl-C stops this reply, not the chat
        engine.abort_request([request_id])
        while engine.has_unfinished_requests():
            engine.step()
    return "".join(pieces)


def chat_loop(llm: Any, params: SamplingParams, stdin: TextIO, stdout: TextIO, system: str | None = None) -> int:
    """Read a message per line until /exit or end of input; stream each reply; keep the history."""
    history: list[dict[str, str]] = [{"role": "system", "content": system}] if system else []
    interactive = stdin.isatty()

    def write(piece: str) -> None:
        stdout.write(piece)
        stdout.flush()

    while True:
        if interactive:
            write("\nyou> ")
        line = stdin.readline()
        if not line:  # end of input (Ctrl-D)
            break
        message = line.rstrip("\n")
        if message.strip() in EXIT_COMMANDS:
            break
        if message.strip() == RESET_COMMAND:
            history = history[:1] if system else []
            continue
        if not message.strip():
            continue
        history.append({"role": "user", "content": message})
        write("assistant> " if interactive else "")
        reply = stream_reply(llm, history, params, write)
        write("\n")
        history.append({"role": "assistant", "content": reply})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    model = args.model if args.model is not None else default_chat_model()
    try:
        params = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed,
                                max_tokens=args.max_tokens)
        llm = LLM(model=model, **cli_engine_args(args, CHAT_ENGINE_ARGS))
    except (ValueError, TypeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"mini chat: {model or 'the shipped tiny model'} ({RESET_COMMAND} clears the history, "
          f"{EXIT_COMMANDS[0]} or Ctrl-D quits)", file=sys.stderr, flush=True)
    return chat_loop(llm, params, sys.stdin, sys.stdout, system=args.system)
