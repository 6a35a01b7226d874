"""The course's views: plain-data models, ipywidgets and static matplotlib figures of a running engine.

Mirrors no vllm/v1 file: this package is course code beside the engine (`mini/` never imports it). Each
view draws the state of the vLLM module it names, but reads a live engine ONLY through its public,
documented surface (docs/engine-internals.md, "Internal interfaces"), never by monkeypatching and never deeper:

- `llm.llm_engine` (an `LLMEngine`): `add_request`, `step()`, `has_unfinished_requests()`, `config`;
- `engine.add_step_observer(observer)`: the observer gets each step's `StepTrace` (mini/metrics/step_trace.py):
  the step's `SchedulerOutput` (what ran, how much, who was preempted), the runner's flat inputs and row ids,
  the persistent batch's `BatchUpdate`, the sampled tokens, the outputs, and `trace.snapshot()`, a
  `PoolSnapshot` (mini/metrics/stats.py: running / waiting ids, each request's block ids and progress, the
  free-block queue in order, ref counts, hashes, pool size, block size). `recording.traced_step(engine)`
  runs one step watched that way;
- `engine.snapshot_pool()` (the same `PoolSnapshot` between steps) and `engine.get_scheduler_stats()` (the
  counters: `SchedulerStats`); plus `engine.scheduler.max_num_scheduled_tokens` and `max_num_running_reqs`;
- `engine.model_runner.input_batch` (the persistent batch's rows: `occupied_requests()`).

`tests/course/views/test_surface.py` scans these modules and fails on anything else. The views:

- `recording`: `record_run(llm, prompts, params)` steps a real engine and snapshots the KV state;
- `block_table`: KV pool grid (each block drawn as its slots: filled ones shaded, so internal fragmentation
  shows), block tables, every owner of a shared block with its ref count, the free queue
  (vllm/v1/core/block_pool.py);
- `attention_mask`: which cache slots each query token reads (vllm/v1/attention/backends/flash_attn.py);
- `kernel_access`: which decode-kernel program reads which KV slots (mini/attention/triton_paged.py);
- `batch_layout`: the flat batch of one step (vllm/v1/worker/gpu_model_runner.py `_prepare_inputs`);
- `batch_rows`: the persistent batch's rows under each BatchUpdate (vllm/v1/worker/gpu_input_batch.py);
- `scheduler_timeline`: steps x requests, continuous vs static batching (vllm/v1/core/sched/scheduler.py);
- `sampling_plots`: the sampler's stages and sampled frequencies (vllm/v1/sample/sampler.py);
- `detokenizer_stream`: incremental detokenization, step by step (vllm/v1/engine/detokenizer.py);
- `prefix_cache`: requests' hash chains, hits, shared blocks and the eviction order, step by step
  (vllm/v1/core/block_pool.py, kv_cache_manager.py);
- `fsm_mask`: a grammar's DFA (layered, or for a JSON schema the trail of states the output walked) with
  the current state, its live transitions, the states a multi-byte token passed through, the allowed tokens
  grouped by the state they lead to, one int32 word of the packed bitmask with its bits, and the model's
  probabilities before and after the mask, as text is typed or sampled from the model token by token
  (vllm/v1/structured_output/);
- `quant_group`: one group of a 4-bit weight: its codes, scale, zero point, packed words and error
  (vllm/model_executor/layers/quantization/utils/quant_utils.py; a static plot and a text table);
- `spec_decode_trace`: per step, each request's drafts, the accepted ones, the rejected one and its
  replacement, the bonus token, and the acceptance-length histogram (vllm/v1/spec_decode/,
  vllm/v1/sample/rejection_sampler.py); it also reads `trace.scheduler_output.scheduled_spec_decode_tokens`
  and `get_scheduler_stats().spec_decoding_stats`;
- `serving_dashboard`: a live view of a serving engine (running / waiting requests, KV usage, tokens/s),
  fed by the engine's stat loggers (vllm/v1/metrics/loggers.py);
- `message_timeline`: one request's messages across the front end, the engine core and the workers, step by
  step, from the events mini's opt-in recorder wrote (mini/metrics/message_trace.py; vllm/v1/engine/core.py,
  core_client.py, vllm/v1/executor/multiproc_executor.py); it reads the recorded events only;
- `sharding`: every tensor-parallel rank's slice of one Llama layer's weights and the collective after each,
  from the model's config (vllm/model_executor/layers/linear.py, vocab_parallel_embedding.py);
- `lora_batch`: one step of a batch mixing LoRA adapters: each request's adapter and slot, each token's slot, and
  the token rows each slot's shrink and expand touch (vllm/lora/punica_wrapper/punica_base.py,
  vllm/lora/model_manager.py); it reads plain data (the step's rows and the slot table) only.

Every widget has a plain-text twin (`text_view`): `widget.text(step=None)` (a step-replay widget: the step its
slider shows, or any step), which is also the widget's `text/plain` (what GitHub, nbconvert or a front end
without the widget manager shows); where `import ipywidgets` fails, the widget function returns that text
view (`TextView`) instead.
"""

from labs.views.attention_mask import (
    AttentionMaskView,
    attention_mask_from_batch,
    attention_mask_view,
    plot_attention_mask,
)
from labs.views.batch_layout import (
    BatchLayout,
    batch_layout,
    batch_layout_from_inputs,
    batch_layout_widget,
    plot_batch_layout,
    render_batch_layout_html,
)
from labs.views.batch_rows import (
    BatchRowsRecording,
    BatchRowsStep,
    batch_rows_widget,
    plot_batch_rows,
    record_batch_updates,
    record_input_batch,
    recording_from_updates,
    render_batch_rows_html,
    replay_batch_update,
)
from labs.views.block_table import (
    BlockTableView,
    block_table_text,
    block_table_view,
    block_table_widget,
    plot_block_table,
    render_block_table_html,
    render_block_table_text,
)
from labs.views.detokenizer_stream import DetokStep, detokenizer_stream, render_detokenizer_html
from labs.views.kernel_access import (
    KernelAccess,
    kernel_access_widget,
    plot_kernel_access,
    record_paged_decode,
    replay_paged_decode,
)
from labs.views.recording import EngineRecording, KVSnapshot, record_run, snapshot_engine, traced_step
from labs.views.sampling_plots import (
    PipelineStage,
    chi_square,
    plot_frequencies,
    plot_sampling_pipeline,
    sampled_frequencies,
    sampling_pipeline_stages,
)
from labs.views.scheduler_timeline import (
    SchedulerTimeline,
    TimelineStep,
    plot_batching_comparison,
    plot_scheduler_timeline,
    record_timeline,
    render_timeline_html,
    scheduler_timeline_widget,
)
from labs.views.text_view import TextView, stack_views

__all__ = [
    "AttentionMaskView", "BatchLayout", "BlockTableView", "EngineRecording", "KVSnapshot",
    "attention_mask_from_batch", "attention_mask_view", "batch_layout", "batch_layout_from_inputs",
    "batch_layout_widget", "block_table_view", "block_table_widget", "plot_attention_mask",
    "plot_batch_layout", "plot_block_table", "record_run", "render_batch_layout_html",
    "render_block_table_html", "snapshot_engine", "traced_step",
]
__all__ += ["TextView", "block_table_text", "render_block_table_text", "stack_views"]
__all__ += ["KernelAccess", "kernel_access_widget", "plot_kernel_access", "record_paged_decode",
            "replay_paged_decode"]
__all__ += ["PipelineStage", "chi_square", "plot_frequencies", "plot_sampling_pipeline", "sampled_frequencies",
            "sampling_pipeline_stages"]
__all__ += ["BatchRowsRecording", "BatchRowsStep", "batch_rows_widget", "plot_batch_rows", "record_batch_updates",
            "record_input_batch", "recording_from_updates", "render_batch_rows_html", "replay_batch_update"]
__all__ += ["SchedulerTimeline", "TimelineStep", "plot_batching_comparison", "plot_scheduler_timeline",
            "record_timeline", "render_timeline_html", "scheduler_timeline_widget"]
__all__ += ["DetokStep", "detokenizer_stream", "render_detokenizer_html"]
