"""Shared helpers for the lab checks: counterexample messages and the "not implemented yet" rule.

Every check in labs/checks/pNN.py takes the learner's function or class as its first argument, runs
it on fixed and seeded random cases against the mini reference, and raises AssertionError with a
minimal counterexample (inputs, expected, got, hint) at the first mismatch. A learner's stub raises
NotImplementedError: `calling()` turns that into NotImplementedYet("... not implemented yet ...").
"""

from __future__ import annotations

import contextlib
import pprint
from collections.abc import Callable, Iterator
from typing import Any

from labs.course.answers import NotImplementedYet

__all__ = ["NotImplementedYet", "calling", "counterexample", "expect_equal", "passed"]

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


@contextlib.contextmanager
def calling(name: str, inputs: dict[str, Any] | None = None) -> Iterator[None]:
    """Run learner code; NotImplementedError -> NotImplementedYet, other errors -> AssertionError."""
    __tracebackhide__ = True
    try:
        yield
    except NotImplementedError as error:
        raise NotImplementedYet(
            f"`{name}` is not implemented yet: replace `raise NotImplementedError()` in its answer cell"
        ) from error
    except AssertionError:
        raise
    except Exception as error:
        if _is_not_implemented(error):
            raise NotImplementedYet(
                f"`{name}` is not implemented yet: replace `raise NotImplementedError()` in its answer cell"
            ) from error
        shown = (
            ""
            if inputs is None
            else "\n  inputs:\n" + "\n".join(f"    {key} = {_short(value)}" for key, value in inputs.items())
        )
        raise AssertionError(f"`{name}` raised {type(error).__name__}: {error}{shown}") from error


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
