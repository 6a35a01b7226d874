"""`LLM`: offline batched generation, the class most people meet first.

Mirrors vllm/entrypoints/llm.py. Like vLLM's, `generate()` adds every prompt to the engine, then steps
the engine until all of them finish, and returns the outputs in prompt order; `chat()` renders
conversations with the chat template first (mini/entrypoints/chat_utils.py), then generates. The constructor takes
the same keyword names as vLLM's engine arguments (the subset mini implements). `beam_search()` runs vLLM v1's
beam search on top of `generate()`, one token per step (mini/beam_search.py).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from mini.beam_search import (
    BeamSearchInstance,
    BeamSearchOutput,
    BeamSearchSequence,
    beam_search_step,
    create_sort_beams_key_function,
)
from mini.config import EngineConfig, engine_config_from_args
from mini.engine.llm_engine import LLMEngine
from mini.entrypoints.chat_utils import (
    Conversation,
    apply_chat_template,
    is_single_conversation,
    normalize_conversation,
)
from mini.lora.request import LoRARequest
from mini.outputs import RequestOutput
from mini.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

PromptType = str | dict[str, Any]


def _engine_args_signature() -> inspect.Signature:
    """`LLM.__init__`'s signature as introspection shows it: `self`, `model`, then every other engine
    argument as a keyword with EngineConfig's default (the constructor itself takes `**engine_args`)."""
    fields = [f for f in dataclasses.fields(EngineConfig) if f.metadata.get("engine_arg", True)]
    keyword = inspect.Parameter.KEYWORD_ONLY
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                  inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)]
    parameters += [inspect.Parameter(f.name, keyword, default=None if f.default is dataclasses.MISSING
                                     else f.default) for f in fields if f.name != "model"]
    return inspect.Signature(parameters, return_annotation=None)


class LLM:
    """An LLM for offline inference: `LLM(model=None).generate(prompts, SamplingParams(...))`."""

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        """`engine_args`: the fields of `EngineConfig` (mini/config.py), by keyword, with its defaults."""
        config = engine_config_from_args(model=model, **engine_args)
        if config.data_parallel_size > 1:     # vLLM's offline LLM needs one process per DP rank; mini refuses
            raise ValueError(f"data_parallel_size={config.data_parallel_size}: LLM runs one engine core; data "
                             "parallelism is for the server (python -m mini serve --data-parallel-size N, or "
                             "AsyncLLM), which routes each request to the least-loaded core. Offline, run one LLM "
                             "per process instead.")
        self.llm_engine = LLMEngine(config)
        self.request_counter = itertools.count()

    __init__.__signature__ = _engine_args_signature()

    def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (vLLM: `LLM.reset_prefix_cache`); False while a request holds blocks."""
        return self.llm_engine.reset_prefix_cache()

    def get_tokenizer(self):
        return self.llm_engine.get_tokenizer()

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate completions for every prompt; outputs come back in prompt order.

        `lora_request` (needs `enable_lora=True`): one `LoRARequest` for every prompt, or one per prompt (None:
        the base model), as vLLM's; requests of different adapters run in the same batch (mini/lora/).

        Every prompt is processed (validated, tokenized) before any is queued, so a bad prompt raises and
        leaves the engine exactly as it was; the processed requests are then queued as they are (each
        prompt is tokenized once).
        """
        prompt_list = self._as_prompt_list(prompts)
        params_list = self._broadcast("sampling_params", sampling_params, len(prompt_list), SamplingParams())
        priority_list = self._broadcast("priority", priority, len(prompt_list), 0)
        if lora_request is None or isinstance(lora_request, LoRARequest):
            lora_list = [lora_request] * len(prompt_list)
        else:
            lora_list = self._broadcast("lora_request", lora_request, len(prompt_list), None)
        if self.llm_engine.config.scheduling_policy != "priority" and any(p != 0 for p in priority_list):
            raise ValueError("priority is only supported with scheduling_policy='priority'")

        engine = self.llm_engine
        first_id = next(self.request_counter)
        request_ids = [str(first_id + index) for index in range(len(prompt_list))]
        self.request_counter = itertools.count(first_id + len(prompt_list))
        processed = []
        for index, (request_id, prompt, params, prio, lora) in enumerate(
                zip(request_ids, prompt_list, params_list, priority_list, lora_list, strict=False)):
            if isinstance(params, SamplingParams):
                # Only the final output is wanted here (vLLM's `_add_request` in vllm/entrypoints/common/offline.py
                # sets FINAL_ONLY on the caller's object; mini sets it on a shallow copy, the caller's stays).
                params = copy.copy(params)
                params.output_kind = RequestOutputKind.FINAL_ONLY
            try:  # process everything first: nothing is queued if one prompt is bad
                processed.append(engine.process_request(request_id, prompt, params, priority=prio, lora_request=lora))
            except (ValueError, TypeError) as error:
                self.request_counter = itertools.count(first_id)   # no id was used
                raise type(error)(f"prompt {index}: {error}") from None
        for request_id, request in zip(request_ids, processed, strict=False):
            engine.add_request(request_id, request)
        return self._run_engine(request_ids, use_tqdm)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: bool = True,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate the assistant's reply to one conversation or to a list of conversations (vLLM's LLM.chat).

        Each conversation is a list of `{"role": ..., "content": ...}` messages, rendered with the
        tokenizer's chat template (or `chat_template`; a tokenizer without one gets the fallback in
        mini/entrypoints/chat_utils.py) and tokenized without adding special tokens again: the template
        already wrote them. One RequestOutput per conversation, in order; `.prompt` is the rendered text.
        """
        tokenizer = self.get_tokenizer()
        if is_single_conversation(messages):
            conversations = [normalize_conversation(messages)]
        elif isinstance(messages, Sequence) and not isinstance(messages, str) and len(messages) > 0:
            conversations = [normalize_conversation(conv, index) for index, conv in enumerate(messages)]
        else:
            raise TypeError("messages must be a list of {'role', 'content'} dicts (one conversation) "
                            f"or a non-empty list of such lists, got {messages!r}")
        prompts: list[PromptType] = []
        for conversation in conversations:
            text = apply_chat_template(
                tokenizer, conversation, chat_template=chat_template,
                add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
                chat_template_kwargs=chat_template_kwargs,
            )
            prompts.append({"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def beam_search(  # noqa: C901 - mirrors vLLM's LLM.beam_search
        self,
        prompts: PromptType | Sequence[PromptType],
        params: BeamSearchParams,
        *,
        use_tqdm: bool = False,
        concurrency_limit: int | None = None,
    ) -> list[BeamSearchOutput]:
        """Beam search as vLLM v1's `LLM.beam_search`: one `BeamSearchOutput` per prompt, best beam first.

        Each step sends every live beam to the engine as a new request (prompt = the beam's tokens,
        `max_tokens=1`, `logprobs=2 * beam_width`), extends each beam by each of its candidate tokens, moves
        the candidates ending in EOS to the completed list (unless `ignore_eos`) and keeps the best
        `beam_width` others by `get_beam_search_score`. After `max_tokens` steps the live and completed beams
        are ranked together. With `enable_prefix_caching=True` every step's requests hit the cached blocks of
        their shared prefix, so only the last partial block of each beam is prefilled again.
        `concurrency_limit` searches that many prompts at a time. A sequence's `tokens` and `text` include
        the prompt, as vLLM's; `text` is None without a tokenizer. All prompts and parameters are checked
        before anything runs.
        """
        if not isinstance(params, BeamSearchParams):
            raise TypeError(f"params must be a mini.sampling_params.BeamSearchParams, got {type(params).__name__}")
        engine = self.llm_engine
        processor = engine.input_processor
        if 2 * params.beam_width > processor.max_logprobs:
            raise ValueError(f"beam_width must be at most {processor.max_logprobs // 2} (each step asks for "
                             f"2 * beam_width logprobs, at most max_logprobs={processor.max_logprobs}), "
                             f"got {params.beam_width}")
        if concurrency_limit is not None and (
            not isinstance(concurrency_limit, int) or isinstance(concurrency_limit, bool) or concurrency_limit < 1
        ):
            raise ValueError(f"concurrency_limit must be None or an int >= 1, got {concurrency_limit!r}")
        # 2 * beam_width candidates per beam, as transformers' beam search keeps (vLLM cites it).
        step_params = SamplingParams(logprobs=2 * params.beam_width, max_tokens=1,
                                     temperature=params.temperature, detokenize=False)
        max_model_len = engine.config.max_model_len
        instances: list[BeamSearchInstance] = []
        for index, prompt in enumerate(self._as_prompt_list(prompts)):
            try:
                request = processor.process(f"validate-{index}", prompt, step_params)
            except (ValueError, TypeError) as error:
                raise type(error)(f"prompt {index}: {error}") from None
            num_prompt_tokens = len(request.prompt_token_ids)
            if num_prompt_tokens + params.max_tokens > max_model_len:
                raise ValueError(f"prompt {index}: max_tokens must be at most {max_model_len - num_prompt_tokens} "
                                 f"(prompt of {num_prompt_tokens} tokens, max_model_len={max_model_len}), "
                                 f"got {params.max_tokens}")
            orig_prompt = {"prompt": request.prompt, "prompt_token_ids": list(request.prompt_token_ids),
                           "cache_salt": request.cache_salt}
            instances.append(BeamSearchInstance(orig_prompt, request.prompt_token_ids))

        eos_token_id = None if params.ignore_eos else processor.eos_token_id
        sort_beams_key = create_sort_beams_key_function(params.length_penalty)
        limit = concurrency_limit or max(1, len(instances))
        for start in range(0, len(instances), limit):
            batch = instances[start:start + limit]
            for _ in tqdm(range(params.max_tokens), desc="Beam search", unit="token", disable=not use_tqdm):
                beams = [beam for instance in batch for beam in instance.beams]
                if not beams:
                    break
                outputs = iter(self.generate([beam.get_prompt() for beam in beams], step_params, use_tqdm=False))
                for instance in batch:
                    beam_logprobs = []
                    for _ in instance.beams:
                        logprobs = next(outputs).outputs[0].logprobs
                        beam_logprobs.append(logprobs[0] if logprobs else None)
                    beam_search_step(instance, beam_logprobs, params.beam_width, params.length_penalty,
                                     eos_token_id)

        results = []
        for instance in instances:
            for beam in instance.completed:  # only EOS moves a beam to `completed`
                beam.finish_reason = "stop"
            for beam in instance.beams:
                beam.finish_reason = "length"
            best = sorted(instance.completed + instance.beams, key=sort_beams_key, reverse=True)[:params.beam_width]
            for beam in best:
                beam.text = self._beam_text(beam, params.include_stop_str_in_output)
            results.append(BeamSearchOutput(sequences=best))
        return results

    def _beam_text(self, beam: BeamSearchSequence, include_stop_str_in_output: bool) -> str | None:
        tokenizer = self.llm_engine.tokenizer
        if tokenizer is None:
            return None
        tokens = beam.tokens
        if beam.finish_reason == "stop" and not include_stop_str_in_output:
            tokens = tokens[:-1]   # the EOS token's text, e.g. "</s>"
        return tokenizer.decode(tokens)

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        finished: dict[str, RequestOutput] = {}
        wanted = set(request_ids)
        bar = tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True)
        num_output_tokens = 0
        with bar:
            while self.llm_engine.has_unfinished_requests():
                for output in self.llm_engine.step():
                    if output.finished and output.request_id in wanted:
                        finished[output.request_id] = output
                        num_output_tokens += sum(len(c.token_ids) for c in output.outputs)
                        elapsed = bar.format_dict["elapsed"] or 1e-9
                        bar.set_postfix_str(f"output: {num_output_tokens / elapsed:.1f} toks/s", refresh=False)
                        bar.update(1)
        return [finished[request_id] for request_id in request_ids]

    @staticmethod
    def _as_prompt_list(prompts: PromptType | Sequence[PromptType]) -> list[PromptType]:
        if isinstance(prompts, (str, dict)):
            return [prompts]
        if not isinstance(prompts, Sequence) or isinstance(prompts, (bytes, bytearray)):
            raise TypeError(
                "prompts must be a str, a {'prompt_token_ids': [...]} dict, or a list of those; "
                f"got {type(prompts).__name__}"
            )
        return list(prompts)

    @staticmethod
    def _broadcast(name: str, value: Any, count: int, default: Any) -> list:
        if value is None:
            return [default] * count
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            if len(value) != count:
                raise ValueError(f"{name} must be one value or a list of {count} (one per prompt), got {len(value)}")
            return list(value)
        return [value] * count
