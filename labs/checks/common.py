"""Shared helpers for the lab checks: counterexample messages and the "not implemented yet" rule.

Every check in labs/checks/pNN.py takes the learner's function or class as its first argument, runs
it on fixed and seeded random cases against the mini reference, and raises AssertionError with a
minimal counterexample (inputs, expected, got, hint) at the first mismatch. A learner's stub raises
NotImplementedError: `calling()` turns that into NotImplementedYet("... not implemented yet ..."); any other
exception becomes an AssertionError with the same counterexample shape (the call, inputs, what the
reference returns, a hint).
"""

from __future__ import annotations

import pprint
import sysconfig
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from torch.overrides import TorchFunctionMode

from labs.course.answers import NotImplementedYet

__all__ = ["CountTorchCalls", "NotImplementedYet", "calling", "counterexample", "expect_equal", "passed"]

_MAX_REPR = 600


def _short(value: Any) -> str:
    text = pprint.pformat(value, width=100, compact=True)
    return text if len(text) <= _MAX_REPR else text[:_MAX_REPR] + " ..."


def counterexample(what: str, inputs: dict[str, Any], expected: Any, got: Any, hint: str) -> str:
    lines = [f"{what}: wrong result on this case", "  inputs:"]
    lines += [f"    {name} = {_short(value)}" for name, value in inputs.items()]
    lines += [f"  expected: {_short(expected)}", f"  got:      {_short(got)}", f"  hint: {hint}"]
    return "\n".join(lines)


def _is_not_implemented(error: BaseException) -> bool:
    """True for NotImplementedError, also when wrapped (Triton's interpreter re-raises it `from` it)."""
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, NotImplementedError):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


_NO_EXPECTED = object()
_LABS_DIR = str(Path(__file__).resolve().parents[1])
_ENGINE_DIR = str(Path(__file__).resolve().parents[2] / "mini")
_LIBRARY_DIRS = tuple({sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")})
DEFAULT_RAISE_HINT = (
    "run the same call in a notebook cell with these inputs: the traceback shows which of your lines "
    "raised; compare with the expected value above"
)


def _where_it_raised(error: BaseException) -> str:
    """`file, line N: code` of the deepest frame in the learner's code (else the deepest frame at all)."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return ""
    own = [
        frame for frame in frames
        if not frame.filename.startswith((_LABS_DIR, _ENGINE_DIR, *_LIBRARY_DIRS))
    ]
    frame = (own or frames)[-1]
    code = f": {frame.line.strip()}" if frame.line else ""
    return f"{frame.filename}, line {frame.lineno}{code}"


def _not_implemented_message(name: str) -> str:
    return f"`{name}` is not implemented yet: replace `raise NotImplementedError()` in its answer cell"


class calling:  # lowercase: used as `with calling(...)`, as it was when it was a function
    """`with calling(name, inputs, expected=..., hint=...):` around a call of the learner's code.

    NotImplementedError (the release stub) becomes NotImplementedYet. Any other exception becomes an
    AssertionError whose FIRST line carries the gist (what raised, and what the reference returns), so
    `pytest -q`'s one-line summary is readable, followed by where it raised, the inputs, the expected
    value and a hint. It is raised `from None` from a hidden frame (`__tracebackhide__`, honoured by
    pytest and IPython): the learner sees the check's line, not this helper's frames or a chained
    traceback. Pass `expected` (what the reference returns for these inputs) wherever it is known before
    the call. AssertionError passes through unchanged (a learner's own asserts, or a nested check)."""

    __slots__ = ("expected", "hint", "inputs", "name")

    def __init__(
        self, name: str, inputs: dict[str, Any] | None = None, expected: Any = _NO_EXPECTED, hint: str | None = None
    ) -> None:
        self.name, self.inputs, self.expected, self.hint = name, inputs, expected, hint

    def __enter__(self) -> None:
        return None

    def __exit__(self, error_type: type[BaseException] | None, error: BaseException | None,
                 _traceback: TracebackType | None) -> bool:
        __tracebackhide__ = True  # read by pytest and IPython
        if error is None or isinstance(error, AssertionError) or not isinstance(error, Exception):
            return False
        if _is_not_implemented(error):
            raise NotImplementedYet(_not_implemented_message(self.name)) from None
        raise AssertionError(self.message(error)) from None

    def message(self, error: BaseException) -> str:
        """The counterexample for a call that raised `error`."""
        headline = f"`{self.name}` raised {type(error).__name__}: {_one_line(error)}"
        if self.expected is not _NO_EXPECTED:
            headline += f" (the reference returns {_one_line(self.expected, 80)})"
        lines = [headline]
        where = _where_it_raised(error)
        if where:
            lines.append(f"  raised at: {where}")
        if self.inputs is not None:
            lines.append("  inputs:")
            lines += [f"    {key} = {_short(value)}" for key, value in self.inputs.items()]
        if self.expected is not _NO_EXPECTED:
            lines.append(f"  expected (the reference, same inputs): {_short(self.expected)}")
        lines.append(f"  hint: {self.hint or DEFAULT_RAISE_HINT}")
        return "\n".join(lines)


def _one_line(value: Any, limit: int = 160) -> str:
    text = " ".join(str(value).split()) if isinstance(value, BaseException) else " ".join(_short(value).split())
    return text if len(text) <= limit else text[: limit - 4] + " ..."


def expect_equal(
    what: str,
    inputs: dict[str, Any],
    expected: Any,
    got: Any,
    hint: str,
    equal: Callable[[Any, Any], bool] | None = None,
) -> None:
    __tracebackhide__ = True
    same = equal(expected, got) if equal is not None else expected == got
    if not same:
        raise AssertionError(counterexample(what, inputs, expected, got, hint))


def passed(name: str, num_cases: int) -> None:
    print(f"ok: {name} passed {num_cases} cases")


def tiny_llama_config(vocab_size: int, hidden_size: int, initializer_range: float, **overrides: Any) -> Any:
    """A 2-layer GQA (4 query / 2 KV heads) random-Llama config with no special tokens.

    No EOS, so greedy loops run to max_new_tokens; a large initializer_range gives peaked logits, so two
    correct implementations rarely meet an argmax tie. Built from a config, never downloaded.
    """
    import transformers

    settings: dict[str, Any] = {
        "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": 2 * hidden_size,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 128, "initializer_range": initializer_range,
        "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
    }
    return transformers.LlamaConfig(**{**settings, **overrides})


class CountTorchCalls(TorchFunctionMode):
    """`with CountTorchCalls() as counter:` counts the torch functions called inside: the vectorization guards
    (a loop over rows or tokens makes the count grow with the batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))
