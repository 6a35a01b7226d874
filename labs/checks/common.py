"""Shared helpers for the lab checks: counterexample messages and the "not implemented yet" rule.

Every check in labs/checks/pNN.py takes the learner's function or class as its first argument, runs
it on fixed and seeded random cases against the mini reference, and raises AssertionError with a
minimal counterexample (inputs, expected, got, hint) at the first mismatch. A learner's stub raises
NotImplementedError: `calling()` turns that into NotImplementedYet("... not implemented yet ..."); any other
exception becomes an AssertionError with the same counterexample shape (the call, inputs, what the
reference returns, a hint).

What several phases' checks share lives here too, so that no pNN.py imports another: phase 02's worked example
and step cases (phase 04 reuses them), `expect_same_tokens` (the "Plug it in" cells of phases 02-05, which import
it from their own phase's module), `first_difference` (where two values differ, as a message) and
`first_differing_entry` (the (row, column) of two [N, V] tensors, phases 08 and 09).
"""

from __future__ import annotations

import pprint
import random
import sysconfig
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from labs.course.answers import NotImplementedYet

__all__ = [
    "CountTorchCalls", "NotImplementedYet", "calling", "counterexample", "describe_difference", "expect_equal",
    "expect_same", "expect_same_outputs", "expect_same_steps", "expect_same_tokens", "first_difference",
    "first_differing_entry", "passed", "random_step", "step_cases", "WORKED_EXAMPLE",
]

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


# ---------------------------------------------------------------- where two tables / tensors / runs part


def _as_array(value: Any) -> Any:
    """A numpy array for a torch tensor or a numpy array (None for anything else)."""
    import numpy as np

    if isinstance(value, np.ndarray):
        return value
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of the course
        return None
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        return tensor.float().numpy() if tensor.dtype == torch.bfloat16 else tensor.numpy()
    return None


def _dtype_name(value: Any) -> str:
    return str(getattr(value, "dtype", type(value).__name__)).removeprefix("torch.")


def _coordinates(index: tuple, axis_names: tuple[str, ...] | None) -> str:
    if axis_names and len(axis_names) >= len(index):
        return ", ".join(f"{name} {i!r}" for name, i in zip(axis_names, index, strict=False))
    return "".join(f"[{i!r}]" for i in index)


def _cell(value: Any) -> str:
    value = value.item() if hasattr(value, "item") else value
    text = f"{value:.4g}" if isinstance(value, float) else repr(value)
    return text if len(text) <= 12 else text[:11] + "~"


def _window_line(values: Any, at: int, window: int) -> tuple[str, int, int]:
    """`values[lo:hi]` as aligned cells around position `at`; (text, lo, column of `at` in the text)."""
    lo, hi = max(0, at - window), min(len(values), at + window + 1)
    cells = [_cell(v) for v in values[lo:hi]]
    width = max(len(c) for c in cells)
    text = " ".join(c.rjust(width) for c in cells)
    column = (at - lo) * (width + 1) + width - 1
    return text, lo, column


def _array_difference(expected: Any, got: Any, path: tuple, axis_names: tuple[str, ...] | None, window: int,
                      atol: float, rtol: float) -> str | None:
    import numpy as np

    e, g = _as_array(expected), _as_array(got)
    if e is None or g is None:
        return (f"at {_coordinates(path, axis_names) or 'the top'}: expected a {type(expected).__name__}, "
                f"got a {type(got).__name__}")
    where = _coordinates(path, axis_names)
    prefix = f"at {where}: " if where else ""
    if e.shape != g.shape:
        return f"{prefix}shape: expected {tuple(e.shape)}, got {tuple(g.shape)}"
    if _dtype_name(expected) != _dtype_name(got):
        return f"{prefix}dtype: expected {_dtype_name(expected)}, got {_dtype_name(got)}"
    if e.dtype.kind in "fc":
        same = np.isclose(e, g, atol=atol, rtol=rtol, equal_nan=True) | ((e == g) & np.isinf(e))
    else:
        same = e == g
    if same.all():
        return None
    wrong = np.argwhere(~same)
    index = tuple(int(i) for i in wrong[0])
    full = path + index
    lines = [(f"first difference at {_coordinates(full, axis_names)} (shape {tuple(e.shape)}, "
              f"{len(wrong)} of {e.size} entries differ): expected {_cell(e[index])}, got {_cell(g[index])}")]
    if e.ndim == 0:
        return lines[0]
    row = index[:-1]
    e_line, lo, column = _window_line(e[row], index[-1], window)
    g_line, _, _ = _window_line(g[row], index[-1], window)
    label = _coordinates(path + row, None) + f"[{lo}:{lo + len(e[row][lo:lo + 2 * window + 1])}]"
    lines += [f"    expected{label}: {e_line}", f"    got{label}:      {g_line}",
              " " * (len(f"    expected{label}: ") + column) + "^"]
    return "\n".join(lines)


def first_difference(expected: Any, got: Any, *, axis_names: tuple[str, ...] | None = None, window: int = 3,
                     atol: float = 0.0, rtol: float = 0.0, _path: tuple = ()) -> str | None:
    """Where `got` first differs from `expected`, in a few lines (None when they are equal).

    Tensors and numpy arrays: the shape, then the dtype, then the first differing entry with its coordinates,
    how many entries differ, and a window of `window` entries either side along the last axis (floats compared
    with `atol` / `rtol`, NaN equal to NaN). Lists and tuples: the length, then element by element (nested
    lists are tables: `[row][column]`). Dicts: the missing and unexpected keys, then key by key. Anything else:
    `==`. `axis_names` names the coordinates ("dfa state", "byte class") instead of `[i][j]`."""
    if _as_array(expected) is not None or _as_array(got) is not None:
        return _array_difference(expected, got, _path, axis_names, window, atol, rtol)
    where = _coordinates(_path, axis_names)
    prefix = f"at {where}: " if where else ""
    if isinstance(expected, dict) and isinstance(got, dict):
        missing = [k for k in expected if k not in got]
        extra = [k for k in got if k not in expected]
        if missing or extra:
            return (f"{prefix}keys: missing {_short(missing)}, unexpected {_short(extra)} "
                    f"(expected keys {_short(list(expected))})")
        for key in expected:
            found = first_difference(expected[key], got[key], axis_names=axis_names, window=window, atol=atol,
                                     rtol=rtol, _path=(*_path, key))
            if found is not None:
                return found
        return None
    if isinstance(expected, (list, tuple)) and isinstance(got, (list, tuple)):
        for i, (e, g) in enumerate(zip(expected, got, strict=False)):
            found = first_difference(e, g, axis_names=axis_names, window=window, atol=atol, rtol=rtol,
                                     _path=(*_path, i))
            if found is not None:
                if all(not isinstance(x, (list, tuple, dict)) for x in expected) and len(expected) > 1:
                    lo, hi = max(0, i - window), min(max(len(expected), len(got)), i + window + 1)
                    found += (f"\n    expected{_coordinates(_path, None)}[{lo}:{hi}]: {_short(list(expected[lo:hi]))}"
                              f"\n    got{_coordinates(_path, None)}[{lo}:{hi}]:      {_short(list(got[lo:hi]))}")
                return found
        if len(expected) != len(got):
            return (f"{prefix}length: expected {len(expected)} entries, got {len(got)} "
                    f"(the first {min(len(expected), len(got))} agree)")
        return None
    if isinstance(expected, float) and isinstance(got, (int, float)) and (atol or rtol):
        import math

        if math.isclose(expected, got, rel_tol=rtol, abs_tol=atol):
            return None
    if expected == got:
        return None
    return f"first difference at {where or 'the top'}: expected {_short(expected)}, got {_short(got)}"


def describe_difference(expected: Any, got: Any, **options: Any) -> str:
    """`first_difference` or, when there is none, a note that the values are equal."""
    return first_difference(expected, got, **options) or "(no difference)"


def expect_same(
    what: str,
    inputs: dict[str, Any],
    expected: Any,
    got: Any,
    hint: str,
    *,
    axis_names: tuple[str, ...] | None = None,
    atol: float = 0.0,
    rtol: float = 0.0,
    window: int = 3,
) -> None:
    """Like `expect_equal`, for tables, tensors and dicts: on a mismatch the message LOCATES the first difference
    (`first_difference`: shape and dtype first, then coordinates and a window around the entry) instead of
    printing both values whole; both are shown whole only when they are short."""
    __tracebackhide__ = True
    found = first_difference(expected, got, axis_names=axis_names, window=window, atol=atol, rtol=rtol)
    if found is None:
        return
    lines = [f"{what}: wrong result on this case", "  inputs:"]
    lines += [f"    {name} = {_short(value)}" for name, value in inputs.items()]
    lines += ["  " + line if not line.startswith("    ") else line for line in found.splitlines()]
    if _as_array(expected) is None and len(_short(expected)) <= 200 and len(_short(got)) <= 200:
        lines += [f"  expected: {_short(expected)}", f"  got:      {_short(got)}"]
    lines.append(f"  hint: {hint}")
    raise AssertionError("\n".join(lines))


def expect_same_steps(
    what: str,
    expected_steps: list[Any],
    got_steps: list[Any],
    *,
    hint: str,
    context: list[Any] | None = None,
    step_names: list[Any] | None = None,
) -> None:
    """Two runs compared step by step (the reference's and the learner's): on a mismatch, the FIRST step where
    they part, both values at that step with the first differing entry, the value both agreed on one step
    before, and `context[step]` (what the reference did at that step, e.g. its scheduler events)."""
    __tracebackhide__ = True
    names = step_names if step_names is not None else list(range(max(len(expected_steps), len(got_steps))))
    for i, (expected, got) in enumerate(zip(expected_steps, got_steps, strict=False)):
        found = first_difference(expected, got)
        if found is None:
            continue
        lines = [f"{what}: your run and the reference part at step {names[i]!r}"
                 + (f" (steps {names[0]!r}..{names[i - 1]!r} agree)" if i else " (the first step)"),
                 f"  expected (reference): {_short(expected)}", f"  got (yours):          {_short(got)}",
                 f"  {found}"]
        if i:
            lines.append(f"  one step before, both had: {_short(expected_steps[i - 1])}")
        if context is not None and i < len(context):
            lines.append(f"  what the reference did at this step: {_short(context[i])}")
        lines.append(f"  hint: {hint}")
        raise AssertionError("\n".join(lines))
    if len(expected_steps) != len(got_steps):
        raise AssertionError(
            f"{what}: the reference ran {len(expected_steps)} steps, yours {len(got_steps)} (the first "
            f"{min(len(expected_steps), len(got_steps))} agree)\n  hint: {hint}")


def _output_fields(output: Any) -> Any:
    """A RequestOutput as {token_ids, text, finish_reason} (of its first completion); anything else as it is."""
    completions = getattr(output, "outputs", None)
    if completions:
        first = completions[0]
        return {"token_ids": list(first.token_ids), "text": first.text, "finish_reason": first.finish_reason}
    return output


def expect_same_outputs(
    expected_outputs: list[Any] | dict[Any, Any],
    got_outputs: list[Any] | dict[Any, Any],
    *,
    what: str = "the engine's outputs",
    prompts: list[Any] | None = None,
    hint: str = "the engine with your parts plugged in must generate exactly what the reference engine does",
) -> None:
    """Two engines' outputs (lists of RequestOutputs, of token-id lists or of any values, or dicts {request id:
    token ids}) compared request by request and token by token; on a mismatch, the first request that differs, its
    prompt, and the first token (step) where the two generations part, with the tokens both agreed on up to there."""
    __tracebackhide__ = True
    if isinstance(expected_outputs, dict) and isinstance(got_outputs, dict):  # {request id: tokens}
        if list(expected_outputs) != list(got_outputs):
            raise AssertionError(f"{what}: expected outputs for requests {list(expected_outputs)}, got them for "
                                 f"{list(got_outputs)}\n  hint: {hint}")
        request_ids = list(expected_outputs)
        expected_outputs, got_outputs = list(expected_outputs.values()), list(got_outputs.values())
    else:
        request_ids = [getattr(output, "request_id", i) for i, output in enumerate(expected_outputs)]
    if len(expected_outputs) != len(got_outputs):
        raise AssertionError(f"{what}: expected {len(expected_outputs)} requests' outputs, got {len(got_outputs)}"
                             f"\n  hint: {hint}")
    for i, (expected, got) in enumerate(zip(expected_outputs, got_outputs, strict=False)):
        e, g = _output_fields(expected), _output_fields(got)
        if first_difference(e, g) is None:
            continue
        request_id = request_ids[i]
        lines = [f"{what}: request {i} (id {request_id!r}) differs from the reference"]
        if prompts is not None and i < len(prompts):
            lines.append(f"  prompt: {_short(prompts[i])}")
        e_tokens = e.get("token_ids") if isinstance(e, dict) else e if isinstance(e, list) else None
        g_tokens = g.get("token_ids") if isinstance(g, dict) else g if isinstance(g, list) else None
        if isinstance(e_tokens, list) and isinstance(g_tokens, list) and e_tokens != g_tokens:
            step = next((k for k, (a, b) in enumerate(zip(e_tokens, g_tokens, strict=False)) if a != b),
                        min(len(e_tokens), len(g_tokens)))
            lines.append(f"  first differing token: step {step} (the generated token number {step}); "
                         f"tokens 0..{step - 1} agree: {_short(e_tokens[:step])}" if step else
                         "  first differing token: step 0 (the very first generated token)")
            lines.append(f"  expected from step {step}: {_short(e_tokens[step:step + 8])}"
                         f"{' ...' if len(e_tokens) > step + 8 else ''} ({len(e_tokens)} tokens in all)")
            lines.append(f"  got from step {step}:      {_short(g_tokens[step:step + 8])}"
                         f"{' ...' if len(g_tokens) > step + 8 else ''} ({len(g_tokens)} tokens in all)")
        else:
            lines.append(f"  {first_difference(e, g)}")
        if isinstance(e, dict) and isinstance(g, dict):
            lines += [f"  expected: text {e.get('text')!r}, finish_reason {e.get('finish_reason')!r}",
                      f"  got:      text {g.get('text')!r}, finish_reason {g.get('finish_reason')!r}"]
        lines.append(f"  hint: {hint}")
        raise AssertionError("\n".join(lines))


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


# ---- shared by several phases' checks (phase 02's worked example and steps feed phase 04's; the "Plug it in"
# cells of phases 02-05 compare tokens with expect_same_tokens; phases 08 and 09 locate a wrong logit)
WORKED_EXAMPLE = {
    "token_ids": [[1, 2, 3, 4, 5], [1, 6, 5, 7, 8, 9, 10], [1, 12, 13]],
    "block_ids": [[1, 2], [3, 4], [5]],
    "block_size": 4,
}


def random_step(rng: random.Random, max_token_id: int = 1000) -> dict[str, Any]:
    """A random step: each request has some tokens cached and schedules a few more (decode = 1)."""
    block_size = rng.choice([1, 2, 4, 8, 16])
    num_reqs = rng.randint(1, 5)
    free_ids = list(range(1, 256))
    rng.shuffle(free_ids)
    token_ids, computed, scheduled, block_ids = [], [], [], []
    for _ in range(num_reqs):
        total = rng.randint(1, 40)
        num_scheduled = 1 if rng.random() < 0.4 else rng.randint(1, total)
        # a chunked prefill: the request's token list (its whole prompt) runs past this step's chunk
        not_yet = rng.randint(1, 12) if rng.random() < 0.3 else 0
        token_ids.append([rng.randrange(max_token_id) for _ in range(total + not_yet)])
        computed.append(total - num_scheduled)
        scheduled.append(num_scheduled)
        num_blocks = -(-total // block_size)
        block_ids.append([free_ids.pop() for _ in range(num_blocks)])
    return {
        "token_ids": token_ids,
        "num_computed_tokens": computed,
        "num_scheduled_tokens": scheduled,
        "block_ids": block_ids,
        "block_size": block_size,
    }


def step_cases(seeds: Iterable[int], max_token_id: int = 1000) -> list[dict[str, Any]]:
    """The worked example's prefill and decode steps, then one random step per seed."""
    prefill = {**WORKED_EXAMPLE, "num_computed_tokens": [0, 0, 0], "num_scheduled_tokens": [5, 7, 3]}
    decode = {
        "token_ids": [t + [99] for t in WORKED_EXAMPLE["token_ids"]],
        "block_ids": [[1, 2], [3, 4], [5]],
        "block_size": 4,
        "num_computed_tokens": [5, 7, 3],
        "num_scheduled_tokens": [1, 1, 1],
    }
    chunked = {  # a 12-token prompt computed 4 at a time (its 2nd chunk) next to a decode: token_ids is longer
        "token_ids": [[(7 * i + 3) % max_token_id for i in range(12)], [1, 12, 13, 14]],
        "block_ids": [[6, 2, 9], [5]],
        "block_size": 4,
        "num_computed_tokens": [4, 3],
        "num_scheduled_tokens": [4, 1],
    }
    return [prefill, decode, chunked, *(random_step(random.Random(seed), max_token_id) for seed in seeds)]


def first_differing_entry(expected: torch.Tensor, got: torch.Tensor) -> tuple[int, int] | None:
    """(row, column) of the first entry where two [N, V] tensors differ (-inf == -inf, NaN == NaN), or None:
    the coordinates, for a check that words its own message (`first_difference` writes the message)."""
    same = (expected == got) | (torch.isnan(expected) & torch.isnan(got))
    wrong = (~same).nonzero()
    return None if wrong.numel() == 0 else (int(wrong[0, 0]), int(wrong[0, 1]))


def expect_same_tokens(mine: Any, expected: Any, label: str) -> None:
    """Raise at the first request whose generated tokens differ, naming it and the first differing token.
    `mine` and `expected`: lists of token lists (request i is the i-th prompt) or dicts request id -> tokens."""
    __tracebackhide__ = True
    if not isinstance(expected, dict):
        expected = {f"prompt {i}": list(tokens) for i, tokens in enumerate(expected)}
    if not isinstance(mine, dict):
        mine = {f"prompt {i}": list(tokens) for i, tokens in enumerate(mine)}
    for req_id, want in expected.items():
        want, have = list(want), list(mine.get(req_id, []))
        if want != have:
            position = next((i for i, (a, b) in enumerate(zip(want, have, strict=False)) if a != b),
                            min(len(want), len(have)))
            raise AssertionError(
                f"{label}: {req_id} generated different tokens from token {position} on; expected {want}, "
                f"got {have}") from None
    extra = sorted(set(mine) - set(expected))
    if extra:
        raise AssertionError(f"{label}: outputs for {extra}, which the reference run does not have") from None
