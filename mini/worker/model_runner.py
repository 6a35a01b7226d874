"""Run one engine step on the model: update request state, build inputs, forward, sample.

Mirrors vllm/v1/worker/gpu_model_runner.py (GPUModelRunner: `_update_states`, `_prepare_inputs`,
`execute_model`, `_sample`). The order of one step:

  1. `update_states`: drop finished/preempted requests, take in new ones, extend the block lists and
     set `num_computed_tokens` of cached ones; keep the persistent batch (input_batch.py) in step.
     mini's choice: a preempted request comes in `finished_req_ids` and returns whole in
     `scheduled_new_reqs`; vLLM v0.33.0 keeps its state and resumes it through `scheduled_cached_reqs`
     (`resumed_req_ids`, block ids replaced rather than extended).
  2. the flat input_ids / positions / slot_mapping / block_table: gathered from the persistent buffers
     (fast_inputs.py) by `ModelRunner`, composed by `prepare_inputs` (prepare_inputs.py) in the readable
     `ReferenceModelRunner` (the class an engine with a replaced `input_preparation` part builds).
  3. forward through the model, which writes K/V into `kv_caches` and reads them back (paged attention);
     on CUDA a decode-only step replays a CUDA graph captured at start-up instead (cuda_graph.py).
  4. logits only at `logits_indices` (each request's last scheduled token), then the sampler (vLLM v0.33.0
     splits the step here: `execute_model` stops after the logits, `sample_tokens` samples, so the engine
     core can compute the grammar bitmask meanwhile; mini does both in one call).
  5. a request still in the middle of its prompt (chunked prefill) discards its sample; the others
     append the token to the runner's own copy of the request, ready to be fed next step.

With speculative decoding (mini/spec_decode/), a request scheduled with drafts feeds them after its last
token; step 4 then samples every row once and verifies the drafts against the logits at their positions
(`_sample`, mini/sample/rejection_sampler.py), and after the step the drafter proposes the next drafts
(`ModelRunnerOutput.spec_token_ids`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

import mini.worker.prepare_inputs as batch_inputs
from mini import roles
from mini.attention import attention_backend_class
from mini.attention.metadata import AttentionMetadata, build_attention_metadata
from mini.compilation import compile_model
from mini.runner_outputs import ModelRunnerOutput
from mini.sample.logits_processor import build_logitsprocs
from mini.sample.logprobs import compute_logprobs, logprobs_to_dicts
from mini.sample.metadata import SamplingMetadata
from mini.sample.rejection_sampler import RejectionSampler, RejectionSamplerOutput
from mini.sample.sampler import Sampler, SamplerOutput
from mini.spec_decode.metadata import SpecDecodeMetadata
from mini.spec_decode.proposer import build_drafter
from mini.structured_output.bitmask import BitmaskApplier
from mini.worker import cuda_graph
from mini.worker.fast_inputs import gather_inputs
from mini.worker.input_batch import CachedRequestState, InputBatch

if TYPE_CHECKING:
    from mini.config import EngineConfig
    from mini.core.sched.output import SchedulerOutput
    from mini.metrics.step_trace import StepTrace
    from mini.model.llama import LlamaForCausalLM
    from mini.sampling_params import SamplingParams
    from mini.structured_output import GrammarOutput


# ---------------------------------------------------------------------- pure step function (phase 04)
def run_model(
    model: torch.nn.Module, kv_caches: list[torch.Tensor], inputs: batch_inputs.PreparedInputs,
    metadata: AttentionMetadata,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward pass over the flat batch -> (hidden `[T, H]`, float32 logits `[B, V]`).

    The forward writes every new token's K/V into `kv_caches`; only the rows at `logits_indices`
    (each request's last scheduled token) go through the LM head.
    """
    hidden = model(inputs.input_ids, inputs.positions, kv_caches, metadata)
    return hidden, model.compute_logits(hidden[inputs.logits_indices])


class ModelRunner:
    """Owns the KV cache tensors, the runner-side request states and the persistent batch.

    Home of the `input_preparation` role (mini/roles.py): its parts are the class attributes below, called
    through `self`. This is the fast runner: its inputs come from the persistent block table and token buffer
    (fast_inputs.py). An engine that replaces one of its parts builds `ReferenceModelRunner` (below, the
    role's reference class), subclassed with the parts in place (`roles.resolve(config, ModelRunner)`).
    """

    prepare_inputs = staticmethod(batch_inputs.prepare_inputs)
    compute_query_start_loc = staticmethod(batch_inputs.compute_query_start_loc)
    compute_positions = staticmethod(batch_inputs.compute_positions)
    compute_slot_mapping = staticmethod(batch_inputs.compute_slot_mapping)
    build_attention_metadata = staticmethod(build_attention_metadata)
    run_model = staticmethod(run_model)

    def __init__(self, config: EngineConfig, model: LlamaForCausalLM, hf_config: Any, num_blocks: int) -> None:
        self.config = config
        self.model = model
        self.hf_config = hf_config
        self.device = torch.device(config.device)
        self.dtype = next(model.parameters()).dtype  # the KV cache stores what the layers compute
        self.block_size = int(config.block_size)
        self.num_blocks = int(num_blocks)
        self.vocab_size = int(model.config.vocab_size)
        # The attention backend, chosen once (mini/attention/): every layer holds the instance. A model loaded
        # from the same config already has it; otherwise (another backend name, a model built apart) build it.
        self.attention_backend = config.resolved_attention_backend()
        backend_class = attention_backend_class(self.attention_backend, config)
        if type(model.attention_backend) is not backend_class:
            model.set_attention_backend(backend_class())
        # LoRA (mini/lora/; vLLM: vllm/v1/worker/lora_model_runner_mixin.py): the projections wrapped, the slots made.
        self.lora_manager = None
        self.lora_requests: dict[str, Any] = {}   # req_id -> its LoRARequest (or None)
        if getattr(config, "enable_lora", False):
            from mini.lora.model_manager import LoRAModelManager
            self.lora_manager = LoRAModelManager(model, config.max_loras, config.max_lora_rank,
                                                 config.max_cpu_loras, config=config)
        compile_model(model, config.compilation_settings)   # torch.compile (mini/compilation.py); mode 0: untouched

        shape = model.kv_cache_shape(self.num_blocks, self.block_size)
        self.kv_caches: list[torch.Tensor] = [
            torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(model.config.num_hidden_layers)
        ]
        self.requests: dict[str, CachedRequestState] = {}
        self.input_batch = roles.resolve(config, InputBatch)(max_num_reqs=int(config.max_num_seqs))
        self.logitsprocs = build_logitsprocs(
            config.logits_processors, self.vocab_size, self.device,
            engine_config=config, max_num_reqs=int(config.max_num_seqs),
        )
        # The sampler role (mini/roles.py): the fused sampler, or the step-by-step one when a part is replaced.
        self.sampler = roles.resolve(config, Sampler)()
        self.rejection_sampler = roles.resolve(config, RejectionSampler)(self.sampler)   # speculative decoding
        self.bitmask_applier = roles.resolve(config, BitmaskApplier)(self.device)  # structured output
        # The last step's SamplingMetadata and the request states it was built for: reused while the batch is
        # unchanged (vLLM's InputBatch keeps its sampling tensors persistent and refreshes them only when a
        # BatchUpdate changed the rows). Output token lists are held by reference, so they stay current.
        self._sampling_metadata_cache: tuple[list[CachedRequestState], SamplingMetadata] | None = None
        # Speculative decoding: proposes each request's next drafts after every step (None: off).
        self.drafter = None
        if config.speculative_config is not None:
            self.drafter = build_drafter(config, model, self.num_blocks)
        # Start-up, after the KV caches exist (vLLM's `compile_or_warm_up_model`): capture the decode CUDA
        # graphs (cuda_graph.py); None when decode runs eager (CPU, enforce_eager, a non-capturable backend).
        self.cuda_graph_runner = None if self.lora_manager is not None else cuda_graph.build_cuda_graph_runner(
            config, model, self.kv_caches, self.attention_backend)   # LoRA: the token->slot mapping changes per step

    # ------------------------------------------------------------------ 1. request state
    def update_states(self, scheduler_output: SchedulerOutput) -> None:
        """Bring `self.requests` and the persistent batch in line with the scheduler's decisions."""
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            self.input_batch.remove_request(req_id)
        scheduled = scheduler_output.num_scheduled_tokens
        for req_id in list(self.input_batch.req_id_to_index):
            if req_id not in scheduled:  # still running, but not this step: out of the batch, state kept
                self.input_batch.remove_request(req_id)

        to_add: list[CachedRequestState] = []
        for new in scheduler_output.scheduled_new_reqs:
            self.input_batch.remove_request(new.req_id)  # a resumed request starts afresh
            state = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=list(new.prompt_token_ids),
                output_token_ids=list(new.output_token_ids),
                sampling_params=new.sampling_params,
                generator=self._make_generator(new.sampling_params),
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
            )
            self.requests[new.req_id] = state
            to_add.append(state)
        cached = scheduler_output.scheduled_cached_reqs
        for req_id, new_block_ids, num_computed in zip(
            cached.req_ids, cached.new_block_ids, cached.num_computed_tokens, strict=False
        ):
            state = self.requests.get(req_id)
            if state is None:
                raise ValueError(f"scheduled_cached_reqs names {req_id!r}, which the runner never received "
                                 "as a new request (or already dropped as finished)")
            state.block_ids.extend(new_block_ids)
            state.num_computed_tokens = num_computed
            if req_id not in self.input_batch.req_id_to_index:
                to_add.append(state)
        for state in to_add:
            self.input_batch.add_request(state)
        self.input_batch.condense()
        self.logitsprocs.update_state(self.input_batch.get_batch_update())

    def _make_generator(self, params: SamplingParams) -> torch.Generator | None:
        if params.seed is None:
            return None
        generator = torch.Generator(device=self.device)
        generator.manual_seed(int(params.seed))
        return generator

    # ------------------------------------------------------------------ 2. inputs
    def _prepare_inputs(self, scheduler_output: SchedulerOutput
                        ) -> tuple[batch_inputs.PreparedInputs, AttentionMetadata, list[int]]:
        """Flat tensors for the rows of the batch, in row order, on the device (vLLM: `_prepare_inputs`).

        The block table and the token ids are persistent (block_table.py, token_ids_buffer.py): only new block
        ids and tokens are written each step; the flat tensors are computed in NumPy (fast_inputs.py).
        `ReferenceModelRunner` composes them from its parts instead (phase 02's path; tests hold the two equal).
        """
        states = self.input_batch.occupied_requests()
        scheduled = [scheduler_output.num_scheduled_tokens[state.req_id] for state in states]
        computed = [state.num_computed_tokens for state in states]
        block_table, token_ids = self.input_batch.block_table, self.input_batch.token_ids
        for row, state in enumerate(states):
            block_table.sync_row(row, state, state.block_ids)
            token_ids.sync_row(row, state)
        # The input ids: one gather from the persistent token buffer, as vLLM's (fast_inputs.py).
        inputs = gather_inputs(token_ids, computed, scheduled, block_table.get(len(states)), self.block_size)
        inputs = inputs.to(self.device)
        # Each row's sequence length, and the two maxima, from the host's lists: reading them from the device
        # tensors (`.tolist()`, `int(t.max())`) would make the CPU wait for the GPU. vLLM keeps them on its
        # CPU-side arrays too.
        seq_lens = [start + count for start, count in zip(computed, scheduled, strict=False)]
        metadata = self.build_attention_metadata(inputs, max_query_len=max(scheduled), max_seq_len=max(seq_lens))
        return inputs, metadata, seq_lens

    def _update_lora_requests(self, scheduler_output: SchedulerOutput) -> None:
        """Each running request's adapter. vLLM keeps it in `CachedRequestState.lora_request`; mini keeps it beside
        the state, so `update_states`, a part a learner writes before LoRA exists (phase 04), knows nothing of it."""
        if self.lora_manager is None:
            return
        for req_id in scheduler_output.finished_req_ids:
            self.lora_requests.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            self.lora_requests[new.req_id] = getattr(new, "lora_request", None)

    # ------------------------------------------------------------------ 3-5. the step
    @torch.inference_mode()
    def execute_model(self, scheduler_output: SchedulerOutput, grammar_output: GrammarOutput | None = None,
                      trace: StepTrace | None = None) -> ModelRunnerOutput:
        # A step observer's trace (mini/metrics/step_trace.py) gets this step's BatchUpdate and flat inputs.
        self.input_batch.batch_update_listener = None if trace is None else trace.record_batch_update
        self.update_states(scheduler_output)
        self._update_lora_requests(scheduler_output)
        states = self.input_batch.occupied_requests()
        if self.drafter is not None:  # speculative decoding: this step's drafts (none ever without a drafter)
            for state in states:
                state.spec_token_ids = list(scheduler_output.scheduled_spec_decode_tokens.get(state.req_id, ()))
        if not states or scheduler_output.total_num_scheduled_tokens == 0:
            return ModelRunnerOutput.empty()
        inputs, metadata, seq_lens = self._prepare_inputs(scheduler_output)
        if self.lora_manager is not None:   # every token's adapter slot (vLLM: `set_active_loras`)
            self.lora_manager.set_active_loras(
                [self.lora_requests.get(state.req_id) for state in states],
                [scheduler_output.num_scheduled_tokens[state.req_id] for state in states])
        if trace is not None:
            trace.inputs = inputs
        hidden, logits = self._forward(inputs, metadata)

        # Mid-prefill rows: the sample is thrown away, so rewind their seeded generators afterwards (as vLLM
        # rewinds the generators of the requests whose sample it discards).
        is_partial = [seq_len < state.num_tokens for state, seq_len in zip(states, seq_lens, strict=False)]
        saved = {row: states[row].generator.get_state() for row in range(len(states))
                 if is_partial[row] and states[row].generator is not None}
        if grammar_output is not None:  # structured output: mask the logits first (raw logprobs included)
            self.bitmask_applier(logits, grammar_output, self.input_batch.req_id_to_index)
        sampler_output, verified = self._sample(states, logits, hidden, inputs)
        for row, generator_state in saved.items():
            states[row].generator.set_state(generator_state)

        prompt_logprobs = self._prompt_logprobs(states, hidden, inputs)  # before outputs grow
        sampled = sampler_output.sampled_token_ids.tolist()
        sampled_token_ids: list[list[int]] = []
        for row, state in enumerate(states):
            if is_partial[row]:
                new_token_ids = []
            elif verified is not None and row in verified.token_ids:   # accepted drafts + one
                new_token_ids = verified.token_ids[row]
            else:
                new_token_ids = [int(sampled[row])]
            for token_id in new_token_ids:
                state.append_output_token(token_id)
            sampled_token_ids.append(new_token_ids)
        logprobs = self._sampled_logprobs(states, sampler_output, is_partial)
        if verified is not None and logprobs is not None:
            for row, entries in verified.logprobs.items():
                logprobs[row] = entries
        spec_token_ids = None
        if self.drafter is not None:
            spec_token_ids = self.drafter.propose(states, sampled_token_ids, is_partial, inputs, hidden)
        return ModelRunnerOutput(
            req_ids=[state.req_id for state in states],
            req_id_to_index=dict(self.input_batch.req_id_to_index),
            sampled_token_ids=sampled_token_ids,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            spec_token_ids=spec_token_ids,
        )

    def _forward(self, inputs: batch_inputs.PreparedInputs, metadata: AttentionMetadata
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """A decode-only step replays a captured graph (hidden states; logits eagerly after, as vLLM) when graphs
        were captured at start-up; every other step runs `run_model` eagerly."""
        graphs = self.cuda_graph_runner
        if graphs is not None and graphs.can_run(inputs.seq_lens.shape[0], inputs.input_ids.shape[0]):
            hidden = graphs.run(inputs)
            return hidden, self.model.compute_logits(hidden[inputs.logits_indices])
        return self.run_model(self.model, self.kv_caches, inputs, metadata)

    def _sample(self, states: list[CachedRequestState], logits: torch.Tensor, hidden: torch.Tensor,
                inputs: batch_inputs.PreparedInputs) -> tuple[SamplerOutput, RejectionSamplerOutput | None]:
        """Every row sampled once (vLLM: `_sample`). Without drafts, the sampler alone; with drafts, the
        rejection sampler: it runs the sampler over every row (a row with drafts gets its bonus token there)
        and verifies the drafts against the target's logits at their positions."""
        sampling_metadata = self._sampling_metadata(states)
        spec = SpecDecodeMetadata.build([state.spec_token_ids for state in states], inputs.query_start_loc)
        if spec is None:
            return self.sampler(logits, sampling_metadata), None
        draft_rows = torch.as_tensor(spec.target_logits_indices, device=hidden.device)
        verified = self.rejection_sampler(spec, None, logits, self.model.compute_logits(hidden[draft_rows]),
                                          sampling_metadata)
        return verified.sampler_output, verified

    def _sampling_metadata(self, states: list[CachedRequestState]) -> SamplingMetadata:
        cached = self._sampling_metadata_cache
        if cached is not None and len(cached[0]) == len(states) and all(
                a is b for a, b in zip(cached[0], states, strict=False)):
            return cached[1]
        metadata = self._build_sampling_metadata(states)
        self._sampling_metadata_cache = (list(states), metadata)
        return metadata

    def _build_sampling_metadata(self, states: list[CachedRequestState]) -> SamplingMetadata:
        return SamplingMetadata.build(
            params=[state.sampling_params for state in states],
            prompt_token_ids=[state.prompt_token_ids for state in states],
            output_token_ids=[state.output_token_ids for state in states],
            generators={row: state.generator for row, state in enumerate(states) if state.generator is not None},
            vocab_size=self.vocab_size,
            device=self.device,
            logitsprocs=self.logitsprocs,
        )

    @staticmethod
    def _sampled_logprobs(states, sampler_output, is_partial) -> list[list[dict[int, float]] | None] | None:
        tensors = sampler_output.logprobs_tensors
        if tensors is None:
            return None
        wanted = [state.sampling_params.logprobs for state in states]
        dicts = logprobs_to_dicts(tensors, wanted)
        return [None if want is None else ([] if partial else [entry])
                for want, partial, entry in zip(wanted, is_partial, dicts, strict=False)]

    def _prompt_logprobs(self, states, hidden, inputs) -> dict[str, list[dict[int, float] | None]]:
        """For requests asking `prompt_logprobs`: logprob of each prompt token given the ones before it."""
        result: dict[str, list[dict[int, float] | None]] = {}
        if all(state.sampling_params.prompt_logprobs is None for state in states):
            return result
        starts = inputs.query_start_loc.tolist()
        for row, state in enumerate(states):
            wanted = state.sampling_params.prompt_logprobs
            first = state.num_computed_tokens
            # (a request resumed after preemption already reported its prompt logprobs)
            if wanted is None or first >= state.num_prompt_tokens or state.output_token_ids:
                continue
            # Row at position p predicts token p + 1; keep those that are prompt tokens.
            count = min(starts[row + 1] - starts[row], state.num_prompt_tokens - 1 - first)
            entries: list[dict[int, float] | None] = [None] if first == 0 else []
            if count > 0:
                logprobs = compute_logprobs(self.model.compute_logits(hidden[starts[row]: starts[row] + count]))
                targets = torch.as_tensor(state.prompt_token_ids[first + 1: first + 1 + count], device=self.device)
                num = self.vocab_size if wanted == -1 else int(wanted)
                tensors = self.sampler.gather_logprobs(logprobs, num, targets)
                entries.extend(logprobs_to_dicts(tensors, [num] * count))
            result[state.req_id] = entries
        return result

    # ------------------------------------------------------------------ benchmarking helpers
    @torch.inference_mode()
    def replay_forward(self, inputs: batch_inputs.PreparedInputs | None) -> torch.Tensor | None:
        """Forward + logits of a recorded step's inputs (a step observer's `trace.inputs`): writes the same
        K/V slots again; no sampling. Times the model alone, the way the step ran it (a decode step replays
        its CUDA graph where one was captured)."""
        if inputs is None:
            return None
        return self._forward(inputs, self.build_attention_metadata(inputs))[1]


class ReferenceModelRunner(ModelRunner):
    """The readable runner: the flat inputs composed by the role's parts from the per-request lists
    (`prepare_inputs` and the `compute_*` functions it calls, then `build_attention_metadata` as phase 02
    writes it, reading its own maxima). The class an engine builds when an `input_preparation` part is
    replaced (mini/roles.py); same tensors as the fast runner's (tests/worker/test_runner_roles.py).
    """

    def _prepare_inputs(self, scheduler_output: SchedulerOutput
                        ) -> tuple[batch_inputs.PreparedInputs, AttentionMetadata, list[int]]:
        states = self.input_batch.occupied_requests()
        scheduled = [scheduler_output.num_scheduled_tokens[state.req_id] for state in states]
        computed = [state.num_computed_tokens for state in states]
        inputs = self.prepare_inputs([state.all_token_ids + state.spec_token_ids for state in states],
                                     computed, scheduled, [state.block_ids for state in states], self.block_size)
        inputs = inputs.to(self.device)
        seq_lens = [start + count for start, count in zip(computed, scheduled, strict=False)]
        return inputs, self.build_attention_metadata(inputs), seq_lens
