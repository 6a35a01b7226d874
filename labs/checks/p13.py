"""Checks for phase 13 (serving), against mini's engine/async_llm and worker/startup.

    check_merge_delta_outputs(merge_delta_outputs)          vs mini.engine.async_llm.merge_delta_outputs
    check_output_handler_step(output_handler_step)          vs mini.engine.async_llm.output_handler_step
    check_generate_stream(generate_stream)                  vs mini.engine.async_llm.generate_stream
    check_determine_num_gpu_blocks(determine_num_gpu_blocks) vs mini.worker.startup.determine_num_gpu_blocks

The two asyncio exercises run against a fake engine core (it replays a seeded script of `EngineCoreOutput`s,
records what it is told to add and abort, and stops emitting for an aborted request), mini's real
`OutputProcessor` (the shipped tokenizer: real detokenizing and stop strings) and real
`RequestOutputCollector`s, step by step next to the reference; a failure names the step, the request, what
the reference did and what the candidate did. Each check runs its event loop on a thread of its own, so it
works in a notebook (whose kernel already runs a loop) as in pytest.

`plug_serving(output_handler_step, generate_stream)` is phase 13's "Plug it in": the learner's two pieces
drive the shipped model through `InprocEngineCore` (mini/engine/async_llm.py) while one client disconnects.

vLLM counterparts (tests/course/vllm_answers/test_p13.py): `RequestOutput.add` (vllm/outputs.py) passes
`check_merge_delta_outputs`; `AsyncLLM.generate` (vllm/v1/engine/async_llm.py) passes `check_generate_stream`;
`request_memory` (vllm/v1/worker/utils.py), `_check_enough_kv_cache_memory` and
`get_kv_cache_config_from_groups` (vllm/v1/core/kv_cache_planning.py) pass `check_determine_num_gpu_blocks`.
vLLM's output handler is a closure inside `AsyncLLM._run_output_handler` (with chunking, multimodal caches and
stat loggers around it), with no function of its own to run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import inspect
import math
import random
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from labs.checks.common import calling, expect_equal, expect_same, first_difference, passed
from labs.checks.grading import graded, import_engine_stack
from labs.manifest import Exercise, Phase
from mini.engine import EngineCoreOutput
from mini.engine.async_llm import RequestOutputCollector
from mini.engine.async_llm import generate_stream as reference_generate
from mini.engine.async_llm import merge_delta_outputs as reference_merge
from mini.engine.async_llm import output_handler_step as reference_handler
from mini.outputs import CompletionOutput, Logprob, RequestOutput
from mini.sampling_params import RequestOutputKind, SamplingParams
from mini.worker.startup import MemoryProfile
from mini.worker.startup import determine_num_gpu_blocks as reference_num_gpu_blocks

WORDS = ["the", " cat", " sat", ",", " on", " a", " mat", ".", "\n", " dog"]


def _delta(rng: random.Random, indices: list[int], finished: bool, with_logprobs: bool,
           prompt_logprobs: Any = None) -> RequestOutput:
    outputs = []
    for index in indices:
        num_tokens = rng.randint(0, 3)
        token_ids = [rng.randrange(100) for _ in range(num_tokens)]
        logprobs = ([{t: Logprob(-rng.random(), 1, None)} for t in token_ids] if with_logprobs else None)
        reason = rng.choice(["stop", "length", "abort"]) if finished else None
        outputs.append(CompletionOutput(index, "".join(rng.choice(WORDS) for _ in token_ids), token_ids,
                                        -rng.random() if with_logprobs else None, logprobs, reason,
                                        "." if reason == "stop" else None))
    return RequestOutput("req-0", "prompt", [1, 2, 3], prompt_logprobs, outputs, finished)


def _prompt_logprobs(rng: random.Random) -> list:
    """Prompt logprobs of the prompt [1, 2, 3], as the first output of a DELTA request carries them (the first
    prompt token has none)."""
    return [None] + [{t: Logprob(-rng.random(), 1, None)} for t in (2, 3)]


def _logprob_dicts(values: Any) -> Any:
    if values is None:
        return None
    return [None if entry is None else {t: getattr(lp, "logprob", lp) for t, lp in entry.items()} for entry in values]


def _summary(output: Any) -> Any:
    """What a reader sees of a RequestOutput (plain values), or a note when it is not one (anything with a
    RequestOutput's fields counts: vLLM's own merge returns its own type)."""
    if not all(hasattr(output, name) for name in ("finished", "request_id", "prompt_logprobs", "outputs")):
        return f"{type(output).__name__} (not a RequestOutput)"
    try:
        return {"finished": output.finished, "request_id": output.request_id,
                "prompt_logprobs": _logprob_dicts(output.prompt_logprobs), "outputs": [
                    {"index": c.index, "text": c.text, "token_ids": list(c.token_ids),
                     "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                     "cumulative_logprob": c.cumulative_logprob, "logprobs": _logprob_dicts(c.logprobs)}
                    for c in output.outputs]}
    except (AttributeError, TypeError) as error:
        return f"a RequestOutput whose outputs are not CompletionOutputs ({type(error).__name__}: {error})"


# ---------------------------------------------------------------- merge_delta_outputs
MERGE_HINT = ("per sample index: texts and token ids (and logprobs) appended, finish_reason, stop_reason and "
              "cumulative_logprob from the new output; a sample only in one of them is kept (in any order); the "
              "prompt logprobs kept from pending")
MERGE_HINTS = {
    "prompt_logprobs": ("a DELTA request's prompt logprobs come once, with its first output: the later deltas carry "
                        "None. Keep pending's when it has them, else they are lost for the reader"),
    "text": "the unread text comes first, the new text is appended to it (per sample index)",
    "token_ids": "the unread token ids come first, the new ones are appended to them (per sample index)",
    "logprobs": ("logprobs are appended like the token ids, one entry per token; when neither output has any "
                 "(the request asked for none), they stay None, not []"),
    "finish_reason": "finish_reason and stop_reason are the NEW output's: the request's state now, not before",
    "stop_reason": "finish_reason and stop_reason are the NEW output's: the request's state now, not before",
    "cumulative_logprob": ("cumulative_logprob is the new output's: it is already the sum over every token so far "
                           "(adding the pending one counts the earlier tokens twice)"),
    "finished": "finished is the new output's",
    "index": "one sample per index of either output: a sample only in one of them is kept as it is",
}


def _by_index(summary: Any) -> Any:
    """The summary with its outputs in index order: the order of `outputs` is not graded (vLLM appends)."""
    if not isinstance(summary, dict):
        return summary
    return {**summary, "outputs": sorted(summary["outputs"], key=lambda c: c["index"])}


def _merge_hint(expected: Any, got: Any) -> str:
    """The hint for the first field where the merged outputs differ."""
    if isinstance(got, dict) and [c["index"] for c in got["outputs"]] != [c["index"] for c in expected["outputs"]]:
        return MERGE_HINTS["index"]
    path = (first_difference(expected, got) or "").split(":")[0]
    key = next((name for name in MERGE_HINTS if f"['{name}']" in path), None)
    return MERGE_HINTS[key] if key else MERGE_HINT


def _merge_cases(seed: int) -> list[tuple[RequestOutput, RequestOutput]]:
    """A chain of deltas a slow reader lets pile up: (pending, new) pairs, pending being the fold so far."""
    rng = random.Random(seed)
    n = rng.choice([1, 1, 2, 3])
    with_logprobs = rng.random() < 0.4
    first = _prompt_logprobs(rng) if rng.random() < 0.5 else None
    pending = _delta(rng, sorted(rng.sample(range(n), rng.randint(1, n))), False, with_logprobs, first)
    pairs = []
    for _ in range(rng.randint(1, 4)):   # a slow reader: several deltas fold into the unread one
        new = _delta(rng, sorted(rng.sample(range(n), rng.randint(1, n))), rng.random() < 0.3, with_logprobs)
        if rng.random() < 0.3:           # a sample new to the collector arrives first in the list
            new = dataclasses.replace(new, outputs=list(reversed(new.outputs)))
        pairs.append((pending, new))
        pending = reference_merge(pending, new)
        if new.finished:                 # the request's last output: nothing follows it
            break
    return pairs


def _worked_merge_cases() -> list[tuple[RequestOutput, RequestOutput]]:
    """The notebook's worked example, then the same with the prompt logprobs of the first output."""
    pending = RequestOutput("req-0", "prompt", [1, 2, 3], None, [CompletionOutput(0, " the", [5], None, None)], False)
    new = RequestOutput("req-0", "prompt", [1, 2, 3], None, [CompletionOutput(0, " cat", [9], None, None, "length"),
                                                            CompletionOutput(1, "A", [7], None, None)], False)
    prompt_logprobs = [None, {2: Logprob(-1.25, 3, None)}, {3: Logprob(-0.5, 1, None)}]
    return [(pending, new), (dataclasses.replace(pending, prompt_logprobs=prompt_logprobs), new)]


@graded
def check_merge_delta_outputs(candidate: Callable, seeds: Iterable[int] = range(30)) -> None:
    cases = _worked_merge_cases()
    for seed in seeds:
        cases += _merge_cases(seed)
    for pending, new in cases:
        inputs = {"pending": _summary(pending), "new": _summary(new)}
        expected = _by_index(_summary(reference_merge(pending, new)))
        with calling("merge_delta_outputs", inputs, expected=expected, hint=MERGE_HINT):
            got = candidate(pending, new)
        got_summary = _by_index(_summary(got))
        if not isinstance(got_summary, dict):
            expect_equal("merge_delta_outputs(pending, new)", inputs, "a RequestOutput", got_summary,
                         "return the merged output: a new RequestOutput (dataclasses.replace(new, ...))")
        expect_same("merge_delta_outputs(pending, new)", inputs, expected, got_summary,
                    _merge_hint(expected, got_summary))
        expect_equal("pending and new after the call", inputs, inputs, {"pending": _summary(pending),
                     "new": _summary(new)}, "build a new output (dataclasses.replace): do not change pending's "
                     "or new's texts, token lists or logprobs in place")
    passed("check_merge_delta_outputs", len(cases))


# ---------------------------------------------------------------- shared: asyncio, tokenizer, requests
def _run_async(make_coroutine: Callable[[], Any]) -> Any:
    """Run a coroutine on a fresh event loop in a thread of its own (a notebook's kernel already runs one)."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = asyncio.run(make_coroutine())
        except BaseException as error:  # noqa: BLE001  (re-raised on the caller's thread)
            result["error"] = error

    thread = threading.Thread(target=target, name="p13-check-loop")
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


@functools.cache
def _tokenizer() -> Any:
    from mini.config import EngineConfig
    from mini.tokenizer import load_tokenizer

    return load_tokenizer(EngineConfig().model_dir)


@functools.cache
def _word_tokens() -> tuple[int, ...]:
    """Token ids of the shipped tokenizer that decode to one lowercase word with a leading space."""
    tokenizer = _tokenizer()
    return tuple(t for t in range(int(tokenizer.vocab_size)) if re.fullmatch(r" [a-z]{3,}", tokenizer.decode([t])))


EOS = 0   # the shipped tokenizer's eos_token_id


@dataclasses.dataclass
class _Plan:
    """One request of a scenario: its tokens, how the core finishes it, its stop strings and output kind."""

    request_id: str
    tokens: list[int]
    finish: str                     # "length" | "eos"
    stop: list[str]
    output_kind: RequestOutputKind

    def core_request(self) -> Any:
        from mini.engine.input_processor import InputProcessor

        params = SamplingParams(temperature=0.0, max_tokens=len(self.tokens), stop=self.stop or None,
                                output_kind=self.output_kind)
        processor = InputProcessor(_tokenizer(), int(_tokenizer().vocab_size), 512, EOS)
        return processor.process(self.request_id, {"prompt_token_ids": [5, 6, 7]}, params, arrival_time=0.0)

    def describe(self) -> dict[str, Any]:
        return {"tokens": _tokenizer().decode(self.tokens), "finished by the core": self.finish,
                "stop": self.stop, "output_kind": self.output_kind.name}


def _plans(rng: random.Random, num_requests: int, stop_kinds: list[str]) -> list[_Plan]:
    words = _word_tokens()
    plans = []
    for index in range(num_requests):
        tokens = [rng.choice(words) for _ in range(rng.randint(4, 8))]
        finish = "eos" if stop_kinds[index] == "eos" else "length"
        if finish == "eos":
            tokens[-1] = EOS
        stop: list[str] = []
        if stop_kinds[index] == "stop_string":
            position = rng.randint(1, len(tokens) - 2)
            stop = [_tokenizer().decode([tokens[position]]).strip()]
        kind = rng.choice([RequestOutputKind.DELTA, RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
        plans.append(_Plan(f"req-{index}", tokens, finish, stop, kind))
    return plans


class FakeEngineCore:
    """An engine core that replays plans: each step, each live request emits 1 or 2 of its planned tokens
    (seeded per step and request, so one request's abort never changes another's script); its last token
    carries the finish reason. Records every add, abort and pull."""

    def __init__(self, plans: list[_Plan], seed: int) -> None:
        self.plans = {plan.request_id: plan for plan in plans}
        self.seed = seed
        self.positions: dict[str, int] = {}
        self.live: list[str] = []
        self.added: list[str] = []
        self.aborted: list[list[str]] = []
        self.num_pulls = 0
        self.step_index = 0

    def start(self, request_id: str) -> None:
        self.positions[request_id] = 0
        self.live.append(request_id)

    async def add_request_async(self, request: Any) -> None:
        self.added.append(request.request_id)
        self.start(request.request_id)

    async def abort_requests_async(self, request_ids: Any) -> None:
        ids = list(request_ids)
        self.aborted.append(ids)
        self.live = [rid for rid in self.live if rid not in ids]

    def next_outputs(self) -> list[EngineCoreOutput]:
        outputs = []
        for request_id in list(self.live):
            rng = random.Random(f"{self.seed}-{self.step_index}-{request_id}")
            if rng.random() < 0.25:
                continue
            plan, position = self.plans[request_id], self.positions[request_id]
            count = 2 if rng.random() < 0.2 else 1
            new = plan.tokens[position:position + count]
            self.positions[request_id] = position + len(new)
            finish_reason = stop_reason = None
            if self.positions[request_id] == len(plan.tokens):
                finish_reason, stop_reason = ("stop", EOS) if plan.finish == "eos" else ("length", None)
                self.live.remove(request_id)
            outputs.append(EngineCoreOutput(request_id, list(new), finish_reason, stop_reason))
        self.step_index += 1
        return outputs

    async def get_output_async(self) -> list[EngineCoreOutput]:
        self.num_pulls += 1
        return self.next_outputs()


def _core_outputs_summary(outputs: list[EngineCoreOutput]) -> list[dict[str, Any]]:
    return [{"request_id": o.request_id, "new_token_ids": list(o.new_token_ids),
             "text": _tokenizer().decode(o.new_token_ids), "finish_reason": o.finish_reason} for o in outputs]


def _output_summary(output: Any) -> Any:
    if not isinstance(output, RequestOutput):
        return f"{type(output).__name__} (not a RequestOutput)"
    return {"finished": output.finished, "outputs": [
        {"text": c.text, "token_ids": list(c.token_ids), "finish_reason": c.finish_reason,
         "stop_reason": c.stop_reason} for c in output.outputs]}


def _take(collector: RequestOutputCollector) -> Any:
    """Read a collector's unread output without waiting (what a reader would get now), or None."""
    output = collector.output
    collector.output = None
    collector.ready.clear()
    return None if output is None else _output_summary(output)


# ---------------------------------------------------------------- output_handler_step
HANDLER_PUSH_HINT = ("each RequestOutput that output_processor.process_outputs(...) returns goes to the collector "
                     "of its request_id (collector.put(output)); the raw EngineCoreOutputs are token ids, not what "
                     "a client reads")
HANDLER_ABORT_HINT = ("process_outputs returns (request_outputs, reqs_to_abort): the requests it finished by a stop "
                      "string. The engine core cannot see text, so it would keep generating (and holding KV blocks) "
                      "for them: await engine_core.abort_requests_async(reqs_to_abort) when there are any, and "
                      "abort nothing else (a request the core finished itself needs no abort)")
HANDLER_COLLECTORS_HINT = ("a request's collector leaves `collectors` when its finished output is pushed (nothing "
                           "follows it); an unfinished request keeps its collector")


class _HandlerRun:
    """One side (reference or candidate) of a step-by-step output-handler run."""

    def __init__(self, plans: list[_Plan], seed: int) -> None:
        from mini.engine.output_processor import OutputProcessor

        self.core = FakeEngineCore(plans, seed)
        self.output_processor = OutputProcessor(_tokenizer())
        self.collectors: dict[str, RequestOutputCollector] = {}
        self.every_collector: dict[str, RequestOutputCollector] = {}
        loop = asyncio.get_running_loop()
        for plan in plans:
            request = plan.core_request()
            self.output_processor.add_request(request)
            collector = RequestOutputCollector(plan.output_kind, loop)
            self.collectors[plan.request_id] = self.every_collector[plan.request_id] = collector
            self.core.start(plan.request_id)

    def observe(self, num_aborts_before: int) -> dict[str, Any]:
        return {"delivered": {rid: _take(c) for rid, c in self.every_collector.items()},
                "aborted": [rid for ids in self.core.aborted[num_aborts_before:] for rid in ids],
                "collectors": sorted(self.collectors),
                "in the output processor": sorted(self.output_processor.request_states),
                "pulls": self.core.num_pulls}


def _handler_scenario(seed: int) -> list[_Plan]:
    rng = random.Random(seed)
    if seed == 0:   # the fixed case: one request finished by length, one by a stop string, one by EOS
        return _plans(rng, 3, ["length", "stop_string", "eos"])
    num_requests = rng.randint(1, 4)
    kinds = [rng.choice(["length", "stop_string", "stop_string", "eos"]) for _ in range(num_requests)]
    return _plans(rng, num_requests, kinds)


async def _check_handler_case(candidate: Callable, seed: int) -> int:
    plans = _handler_scenario(seed)
    reference, learner = _HandlerRun(plans, seed), _HandlerRun(plans, seed)
    requests = {plan.request_id: plan.describe() for plan in plans}
    steps = 0
    for step in range(40):
        aborts_before = (len(reference.core.aborted), len(learner.core.aborted))
        core_outputs = FakeEngineCore(plans, seed)
        core_outputs.positions, core_outputs.live = dict(reference.core.positions), list(reference.core.live)
        core_outputs.step_index = reference.core.step_index
        step_outputs = _core_outputs_summary(core_outputs.next_outputs())   # what the core emits this step
        await reference_handler(reference.core, reference.output_processor, reference.collectors)
        inputs = {"seed": seed, "step": step, "requests": requests, "engine core outputs this step": step_outputs}
        with calling("output_handler_step", inputs, hint="one step: pull, process, push, abort"):
            await candidate(learner.core, learner.output_processor, learner.collectors)
        want, got = reference.observe(aborts_before[0]), learner.observe(aborts_before[1])
        expect_equal(f"step {step}: engine_core.get_output_async() calls so far", inputs, want["pulls"], got["pulls"],
                     "one iteration of the output handler pulls the engine core's outputs exactly once")
        for request_id in want["delivered"]:
            expect_equal(f"step {step}, request {request_id!r}: the output in its collector", inputs,
                         want["delivered"][request_id], got["delivered"][request_id], HANDLER_PUSH_HINT)
        expect_equal(f"step {step}: the requests the engine core was told to abort", inputs, want["aborted"],
                     got["aborted"], HANDLER_ABORT_HINT)
        expect_equal(f"step {step}: the request ids left in `collectors`", inputs, want["collectors"],
                     got["collectors"], HANDLER_COLLECTORS_HINT)
        expect_equal(f"step {step}: the requests left in the output processor", inputs,
                     want["in the output processor"], got["in the output processor"],
                     "pass every EngineCoreOutput through output_processor.process_outputs: it detokenizes, checks "
                     "stop strings and forgets finished requests")
        steps += 1
        if not reference.core.live and not reference.collectors:
            break
    return steps


@graded
def check_output_handler_step(candidate: Callable, seeds: Iterable[int] = range(12)) -> None:
    async def run() -> int:
        return sum([await _check_handler_case(candidate, seed) for seed in seeds])

    num_cases = _run_async(run)
    passed("check_output_handler_step", num_cases)


# ---------------------------------------------------------------- generate_stream
DISCONNECT_MODES = ("cancel", "aclose", "none")


@dataclasses.dataclass
class _StreamRun:
    """What one run of a disconnect scenario produced."""

    streams: dict[str, list[Any]]
    aborted: list[list[str]]
    added: list[str]
    left_in_processor: list[str]
    left_in_collectors: list[str]
    victim_cancelled: bool | None
    not_done: list[str]
    errors: dict[str, str]


# Complex by design: a scripted scenario.
async def _stream_scenario(generate: Callable, plans: list[_Plan], seed: int, victim: str, mode: str,  # noqa: C901
                           after: int) -> _StreamRun:
    from mini.engine.output_processor import OutputProcessor

    core = FakeEngineCore(plans, seed)
    output_processor = OutputProcessor(_tokenizer())
    collectors: dict[str, RequestOutputCollector] = {}
    streams: dict[str, list[Any]] = {plan.request_id: [] for plan in plans}
    errors: dict[str, str] = {}

    async def consume(plan: _Plan) -> None:
        stream = generate(core, output_processor, collectors, plan.core_request())
        if inspect.iscoroutine(stream):   # an `async def` with no `yield` (the release stub is one)
            await stream
            raise TypeError("generate_stream must be an async generator: it yields the request's outputs")
        try:
            while True:
                try:
                    output = await stream.__anext__()
                except StopAsyncIteration:
                    return
                streams[plan.request_id].append(_output_summary(output))
                if plan.request_id == victim and mode == "aclose" and len(streams[victim]) == after:
                    await stream.aclose()     # the client stops reading: the generator is closed
                    return
        except asyncio.CancelledError:
            raise
        except NotImplementedError:
            raise
        except Exception as error:  # noqa: BLE001  (reported below, as the learner's error)
            errors[plan.request_id] = f"{type(error).__name__}: {error}"

    tasks = {plan.request_id: asyncio.get_running_loop().create_task(consume(plan)) for plan in plans}
    for _ in range(5):
        await asyncio.sleep(0)
    cancelled_at = None
    for _ in range(60):
        if all(task.done() for task in tasks.values()):
            break
        await reference_handler(core, output_processor, collectors)
        for _ in range(5):
            await asyncio.sleep(0)
        if mode == "cancel" and cancelled_at is None and len(streams[victim]) >= after:
            tasks[victim].cancel()        # the client disconnected: the server cancels its task
            cancelled_at = True
            for _ in range(5):
                await asyncio.sleep(0)
    not_done = sorted(rid for rid, task in tasks.items() if not task.done())
    for rid in not_done:
        tasks[rid].cancel()
    results = await asyncio.gather(*tasks.values(), return_exceptions=True)
    for result in results:
        if isinstance(result, (NotImplementedError, TypeError)):   # the stub, or not an async generator
            raise result
    victim_task = tasks[victim]
    return _StreamRun(streams, core.aborted, core.added, sorted(output_processor.request_states),
                      sorted(collectors), victim_task.cancelled() if mode == "cancel" else None, not_done, errors)


def _stream_case(seed: int) -> tuple[list[_Plan], str, str, int]:
    rng = random.Random(seed)
    num_requests = 2 if seed < 3 else rng.randint(2, 3)
    kinds = [rng.choice(["length", "eos", "stop_string"]) for _ in range(num_requests)]
    plans = _plans(rng, num_requests, kinds)
    victim = plans[rng.randrange(num_requests)].request_id
    return plans, victim, DISCONNECT_MODES[seed % 3], rng.randint(1, 2)


async def _check_stream_case(candidate: Callable, seed: int) -> None:
    plans, victim, mode, after = _stream_case(seed)
    want = await _stream_scenario(reference_generate, plans, seed, victim, mode, after)
    with calling("generate_stream", {"seed": seed}):
        got = await _stream_scenario(candidate, plans, seed, victim, mode, after)
    story = {"cancel": f"the client of {victim!r} disconnects after {after} output(s): its task is cancelled",
             "aclose": f"the client of {victim!r} stops after {after} output(s) and closes the stream (aclose)",
             "none": "every client reads its stream to the end"}[mode]
    inputs = {"seed": seed, "requests": {plan.request_id: plan.describe() for plan in plans}, "scenario": story}
    for request_id, error in got.errors.items():
        expect_equal(f"the stream of {request_id!r}", inputs, "no exception", error,
                     "the generator raised while a client was reading it: see the message")
    expect_equal("requests added to the engine core (in order)", inputs, want.added, got.added,
                 "add the request to the output processor and to the engine core (await "
                 "engine_core.add_request_async(request)) once, before waiting for outputs")
    for request_id in want.streams:
        role = "the disconnecting client" if request_id == victim and mode != "none" else "a client that stays"
        expect_equal(f"the outputs {role} {request_id!r} received", inputs, want.streams[request_id],
                     got.streams[request_id],
                     "yield each output from the request's collector (await collector.get()) until the finished "
                     "one; other requests must keep streaming while one client goes away")
    expect_equal("streams still waiting when the engine had nothing left", inputs, want.not_done, got.not_done,
                 "a stream ends after yielding the output with finished=True")
    wanted = {rid for ids in want.aborted for rid in ids}
    extra = sorted({rid for ids in got.aborted for rid in ids} - wanted)
    if extra:
        hint = (f"{extra} finished normally (its consumer read it to the end) and needs no abort: abort only when "
                "the consumer goes away")
    else:
        missing = sorted(wanted - {rid for ids in got.aborted for rid in ids})
        hint = (f"{missing} never reached the engine core as an abort. " if missing else "") + (
                "when the consumer goes away (asyncio.CancelledError when its task is cancelled, GeneratorExit "
                "when the generator is closed), abort the request in the engine core (await "
                "engine_core.abort_requests_async([request_id])): else the core keeps generating for nobody and "
                "holds its KV blocks until max_tokens")
    expect_equal("the aborts the engine core received", inputs, want.aborted, got.aborted, hint)
    expect_equal("requests left in the output processor at the end", inputs, want.left_in_processor,
                 got.left_in_processor,
                 "abort the request in the output processor too (output_processor.abort_requests([request_id])): "
                 "else its detokenizer state stays forever")
    expect_equal("request ids left in `collectors` at the end", inputs, want.left_in_collectors,
                 got.left_in_collectors, "a request whose consumer went away gives up its collector "
                 "(collectors.pop(request_id))")
    if mode == "cancel":
        expect_equal(f"the cancelled task of {victim!r} ended cancelled", inputs, want.victim_cancelled,
                     got.victim_cancelled,
                     "after aborting, re-raise the CancelledError (a bare `raise`): swallowing it tells the server "
                     "the handler finished normally")


@graded
def check_generate_stream(candidate: Callable, seeds: Iterable[int] = range(9)) -> None:
    seeds = list(seeds)

    async def run() -> None:
        for seed in seeds:
            await _check_stream_case(candidate, seed)

    _run_async(run)
    passed("check_generate_stream", len(seeds))


# ---------------------------------------------------------------- determine_num_gpu_blocks
MiB = 2**20
GiB = 2**30
BLOCKS_HINT = ("budget = ceil(gpu_memory_utilization x total) - (weights + peak activations + non-torch memory); "
               "blocks = budget // bytes_per_block, the null block among them; refuse (ValueError) a budget <= 0 and "
               "a pool whose usable blocks (all but the null block) cannot hold one max_model_len request")


def _wrong_formulas(profile: MemoryProfile, util: float, per_block: int) -> dict[str, int]:
    """What a few plausible slips give, to name the one the candidate made."""
    total, weights = profile.total_bytes, profile.weights_bytes
    peak, other = profile.peak_activation_bytes, profile.non_torch_bytes
    requested = math.ceil(total * util)
    return {
        "the peak activations of the profiling run were not subtracted": (requested - weights - other) // per_block,
        "the weights were not subtracted": (requested - peak - other) // per_block,
        "the non-torch memory was not subtracted": (requested - weights - peak) // per_block,
        "gpu_memory_utilization was applied after subtracting (it caps the whole device: requested = util x total)":
            math.floor((total - weights - peak - other) * util) // per_block,
        "the requested memory was rounded down (vLLM rounds it up: math.ceil)":
            (math.floor(total * util) - weights - peak - other) // per_block,
        "the null block was added on top (it is one of the blocks the budget buys)":
            (requested - weights - peak - other) // per_block + 1,
    }


def _blocks_cases(seeds: Iterable[int]) -> list[tuple[MemoryProfile, float, int, int, int]]:
    per_block_example = 2 * 24 * 16 * 2 * 64 * 2     # 192 KiB: 24 layers, 2 KV heads of 64, bf16, block 16
    cases = [
        (MemoryProfile(16 * GiB, 1024 * MiB, 512 * MiB, 256 * MiB), 0.75, per_block_example, 16, 32768),  # example
        (MemoryProfile(10_001, 0, 0, 1), 0.5, 1000, 16, 64),      # ceil(5000.5) = 5001: 5 blocks, 4 usable: fits
        (MemoryProfile(10_000, 1000, 500, 500), 0.5, 600, 16, 64),   # budget 3000: 5 blocks, 4 usable: fits
        (MemoryProfile(10_000, 1000, 501, 500), 0.5, 600, 16, 64),   # 2999: 4 blocks, 3 usable: too few
        (MemoryProfile(8 * GiB, 4 * GiB, 1 * GiB, 0), 0.5, 4096, 16, 256),   # nothing left: ValueError
        (MemoryProfile(126_000, 0, 0, 0), 0.5, 1000, 16, 1000),   # 63 blocks, 62 usable; 1000 tokens need 63
        (MemoryProfile(128_000, 0, 0, 0), 0.5, 1000, 16, 1000),   # 64 blocks, 63 usable: fits
        (MemoryProfile(80 * GiB, 16 * GiB, 2 * GiB, 1 * GiB), 0.9, 2 * 32 * 16 * 8 * 128 * 2, 16, 8192),
    ]
    for seed in seeds:
        rng = random.Random(seed)
        per_block = rng.choice([1000, 4096, 49152, 196608])
        block_size = rng.choice([1, 16, 32])
        max_model_len = rng.choice([64, 256, 1000, 4096])
        util = rng.choice([0.5, 0.8, 0.9, 0.92, 0.95])
        need = (-(-max_model_len // block_size) + 1) * per_block
        total = rng.randint(need, 40 * need)
        weights = rng.randint(0, total // 3)
        peak = rng.randint(0, total // 10)
        other = rng.randint(0, total // 20)
        cases.append((MemoryProfile(total, weights, peak, other), util, per_block, block_size, max_model_len))
    return cases


@graded
def check_determine_num_gpu_blocks(candidate: Callable, seeds: Iterable[int] = range(40)) -> None:
    cases = _blocks_cases(seeds)
    for profile, util, per_block, block_size, max_model_len in cases:
        inputs = {"profile": profile, "gpu_memory_utilization": util, "bytes_per_block": per_block,
                  "block_size": block_size, "max_model_len": max_model_len}
        try:
            expected: Any = reference_num_gpu_blocks(profile, util, per_block, block_size, max_model_len)
        except ValueError as error:
            expected = f"ValueError ({error})"
        if isinstance(expected, str):
            refused = False
            try:
                with calling("determine_num_gpu_blocks", inputs):
                    got = candidate(profile, util, per_block, block_size, max_model_len)
            except AssertionError as error:
                if not str(error).startswith("`determine_num_gpu_blocks` raised ValueError"):
                    raise
                refused = True
            if not refused:
                blocks_per_request = -(-max_model_len // block_size)
                expect_equal("determine_num_gpu_blocks(...)", inputs, expected, got,
                             f"this budget cannot serve one request of max_model_len={max_model_len} tokens "
                             f"({blocks_per_request} blocks, a partial block counting as a whole one) in its "
                             "usable blocks: the null block (block 0) is never handed out, so it does not count; "
                             "raise ValueError. " + BLOCKS_HINT)
            continue
        with calling("determine_num_gpu_blocks", inputs, expected=expected, hint=BLOCKS_HINT):
            got = candidate(profile, util, per_block, block_size, max_model_len)
        hint = next((f"{slip}. " + BLOCKS_HINT for slip, value in _wrong_formulas(profile, util, per_block).items()
                     if value == got and value != expected), BLOCKS_HINT)
        is_int = isinstance(got, int) and not isinstance(got, bool)
        expect_equal("determine_num_gpu_blocks(...) type", inputs, "int", type(got).__name__,
                     "a number of blocks is an int: floor division (//), not /", equal=lambda _a, _b, ok=is_int: ok)
        expect_equal("determine_num_gpu_blocks(...)", inputs, expected, got, hint)
    passed("check_determine_num_gpu_blocks", len(cases))


# ---------------------------------------------------------------- Plug it in
@functools.cache
def _plug_engine() -> Any:
    from mini.config import EngineConfig
    from mini.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(max_model_len=128, num_gpu_blocks_override=48))


async def _plug_streams(output_handler_step: Callable, generate_stream: Callable, prompts: list[list[int]],
                        max_tokens: int, victim: int, stop: str | None, engine: Any) -> dict[str, Any]:
    from mini.engine.async_llm import InprocEngineCore
    from mini.engine.input_processor import InputProcessor

    if engine.has_unfinished_requests():
        raise ValueError("plug_serving needs an idle LLMEngine (one with no request in flight)")
    core = InprocEngineCore(engine)
    output_processor, collectors = core.output_processor, {}
    processor = InputProcessor(engine.tokenizer, engine.vocab_size, int(engine.config.max_model_len), EOS)
    texts: dict[str, str] = {}
    pool = engine.scheduler.kv_cache_manager.block_pool
    free_at_start = pool.get_num_free_blocks()

    async def client(index: int, prompt: list[int]) -> None:
        request_id = f"plug-{index}"
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True,
                                output_kind=RequestOutputKind.DELTA, stop=[stop] if stop and index == 0 else None)
        request = processor.process(request_id, {"prompt_token_ids": prompt}, params, arrival_time=0.0)
        texts[request_id] = ""
        async for output in generate_stream(core, output_processor, collectors, request):
            texts[request_id] += output.outputs[0].text

    tasks = [asyncio.get_running_loop().create_task(client(i, p)) for i, p in enumerate(prompts)]
    for _ in range(200):
        if all(task.done() for task in tasks):
            break
        await output_handler_step(core, output_processor, collectors)
        for _ in range(3):
            await asyncio.sleep(0)
        if not tasks[victim].done() and len(texts.get(f"plug-{victim}", "")) > 0:
            tasks[victim].cancel()     # this client disconnects after its first piece of text
    results = await asyncio.gather(*tasks, return_exceptions=True)
    return {"texts": texts, "aborted": list(core.aborted), "results": results,
            "left_in_processor": sorted(output_processor.request_states), "left_in_collectors": sorted(collectors),
            "left_in_scheduler": sorted(engine.scheduler.requests),
            "free_blocks": (free_at_start, pool.get_num_free_blocks())}


def plug_serving(output_handler_step: Callable, generate_stream: Callable, max_tokens: int = 12,
                 engine: Any = None) -> dict[str, Any]:
    """Your handler and generator serve three clients of the shipped model through `InprocEngineCore`:
    client 0 has a stop string, client 2 disconnects after its first text; returns what happened, after
    comparing it with mini's own pieces on the same clients (AssertionError saying what differed).

    `engine`: an idle `LLMEngine` of the shipped model to serve with (default: one built once, 48 blocks)."""
    engine = _plug_engine() if engine is None else engine   # each run ends with every request gone
    prompts = [[1, 450, 2217, 1103], [1, 938, 2501, 263, 931], [1, 319, 635, 3290]]
    stop_probe = _run_async(lambda: _plug_streams(reference_handler, reference_generate, prompts, max_tokens,
                                                  2, None, engine))
    words = stop_probe["texts"]["plug-0"].split()
    stop = words[len(words) // 2] if len(words) > 2 else None   # a word from the middle of client 0's text
    want = _run_async(lambda: _plug_streams(reference_handler, reference_generate, prompts, max_tokens, 2, stop,
                                            engine))
    got = _run_async(lambda: _plug_streams(output_handler_step, generate_stream, prompts, max_tokens, 2, stop,
                                           engine))
    inputs = {"prompts (token ids)": prompts, "max_tokens": max_tokens, "client 0's stop string": stop,
              "client 2": "disconnects after its first piece of text"}
    errors = {f"plug-{i}": f"{type(r).__name__}: {r}" for i, r in enumerate(got["results"])
              if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)}
    expect_equal("exceptions raised in the clients' streams", inputs, {}, errors,
                 "a stream raised while the engine served it: see the message")
    for request_id, text in want["texts"].items():
        expect_equal(f"the text client {request_id!r} received", inputs, text, got["texts"].get(request_id),
                     "the same engine, the same greedy tokens: your handler or your generator lost or changed "
                     "outputs on their way to this client")
    expect_equal("the aborts the engine core received (sorted)", inputs, sorted(want["aborted"]),
                 sorted(got["aborted"]),
                 "client 0's stop string and client 2's disconnect each end in one abort in the engine core")
    for what in ("left_in_processor", "left_in_collectors", "left_in_scheduler"):
        expect_equal(f"requests {what.replace('_', ' ')} at the end", inputs, want[what], got[what],
                     "every request ends: finished, stopped by its string, or aborted when its client left")
    expect_equal("free KV blocks (at the start, at the end)", inputs, want["free_blocks"], got["free_blocks"],
                 "every block comes back to the pool once all requests ended")
    return got


# Built once in the grading process before it forks a child per check (labs/checks/grading.py).
WARM_UP = (_tokenizer, _word_tokens, import_engine_stack)

PHASE = Phase("13_serving", (
    Exercise("merge_delta_outputs", check_merge_delta_outputs, points=2, grade_id="test-merge-delta-outputs"),
    Exercise("output_handler_step", check_output_handler_step, points=4, grade_id="test-output-handler-step"),
    Exercise("generate_stream", check_generate_stream, points=4, grade_id="test-generate-stream",
             design="the stream's exit when its consumer leaves (task cancelled or generator closed): where each "
                    "surfaces, what to undo where, what to let through, so that exactly one abort reaches the core "
                    "and nothing of the request is left"),
    Exercise("determine_num_gpu_blocks", check_determine_num_gpu_blocks, points=3,
             grade_id="test-determine-num-gpu-blocks"),
))
