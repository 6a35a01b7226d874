"""The incremental detokenizer, token by token: bytes, offsets and the text each token releases.

Mirrors no single vllm/v1 file; it replays `detokenize_incrementally` (vLLM:
vllm/tokenizers/detokenizer_utils.py, used by vllm/v1/engine/detokenizer.py) exactly as the
engine's detokenizer drives it (mini: mini/engine/detokenizer.py).

- `detokenizer_stream(tokenizer, prompt_ids, output_ids)` -> list[`DetokStep`]: plain data;
- `render_detokenizer_html(steps)`: an HTML table, one row per output token.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

from mini.engine import detokenizer as detok


@dataclass(slots=True)
class DetokStep:
    token_id: int
    token: str  # the token string (byte-level BPE shows bytes as printable characters)
    utf8_bytes: bytes  # the raw bytes this token stands for (b"" when the tokenizer has no byte decoder)
    alone: str  # what decoding this token on its own would print
    emitted: str  # the text this token made final ("" while a character is incomplete)
    prefix_offset: int  # offsets after the call
    read_offset: int


def _token_bytes(token: str) -> bytes:
    """The bytes a byte-level BPE token stands for; b"" for a token outside that alphabet."""
    try:
        return _byte_level_bytes(token)
    except KeyError:
        return b""


def _byte_level_bytes(token: str) -> bytes:
    """Undo GPT-2's byte-to-printable-character map (Ġ -> 0x20 and so on)."""
    return bytes(_BYTE_OF_CHAR[char] for char in token)


def _byte_of_char() -> dict[str, int]:
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    codes = list(printable)
    num_extra = 0
    for byte in range(256):
        if byte not in printable:  # unprintable bytes are shifted to 256, 257, ... (GPT-2's bytes_to_unicode)
            printable.append(byte)
            codes.append(256 + num_extra)
            num_extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=False)}


_BYTE_OF_CHAR = _byte_of_char()


def detokenizer_stream(tokenizer: Any, prompt_ids: list[int], output_ids: list[int]) -> list[DetokStep]:
    """Replay the engine's detokenizer on `output_ids` (after `prompt_ids`), one step per token."""
    context = prompt_ids[-(detok.INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET + 2) :]
    tokens = list(tokenizer.convert_ids_to_tokens(context))
    read_offset = len(tokens)
    prefix_offset = max(read_offset - detok.INITIAL_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
    steps = []
    for token_id in output_ids:
        token = tokenizer.convert_ids_to_tokens([token_id])[0]
        tokens.append(token)
        emitted, prefix_offset, read_offset = detok.detokenize_incrementally(
            tokenizer, tokens, prefix_offset, read_offset
        )
        steps.append(
            DetokStep(
                token_id,
                token,
                _token_bytes(token),
                tokenizer.decode([token_id]),
                emitted,
                prefix_offset,
                read_offset,
            )
        )
    return steps


def render_detokenizer_html(steps: list[DetokStep]) -> str:
    """One row per output token: token, bytes, decoded alone, text released, offsets after the call."""
    rows = []
    for index, step in enumerate(steps):
        waiting = step.emitted == ""
        style = "background:#fdecea" if waiting else ""
        rows.append(
            f"<tr style='{style}'><td>{index}</td><td>{step.token_id}</td>"
            f"<td><code>{html.escape(step.token)}</code></td>"
            f"<td><code>{step.utf8_bytes.hex(' ')}</code></td><td>{html.escape(repr(step.alone))}</td>"
            f"<td><b>{html.escape(repr(step.emitted)) if not waiting else '(wait)'}</b></td>"
            f"<td>{step.prefix_offset}</td><td>{step.read_offset}</td></tr>"
        )
    text = html.escape("".join(step.emitted for step in steps))
    return (
        "<div style='font-family:sans-serif'><table><tr><th>#</th><th>id</th><th>token</th>"
        "<th>UTF-8 bytes</th>"
        "<th>decoded alone</th><th>released</th><th>prefix_offset</th><th>read_offset</th></tr>"
        f"{''.join(rows)}</table><div>text so far: <b>{text}</b></div></div>"
    )
