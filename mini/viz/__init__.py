"""Views for the course: plain-data models, HTML/ipywidgets rendering and static matplotlib figures.

Mirrors no vllm/v1 file; each view draws the state of the vLLM module it names:

- `recording`: `record_run(llm, prompts, params)` steps a real engine and snapshots the KV state;
- `block_table`: KV pool grid, block tables, ref counts, free queue (vllm/v1/core/block_pool.py);
- `batch_layout`: the flat batch of one step (vllm/v1/worker/gpu_model_runner.py `_prepare_inputs`).
"""

from mini.viz.batch_layout import (
    BatchLayout,
    batch_layout,
    batch_layout_from_inputs,
    batch_layout_widget,
    plot_batch_layout,
    render_batch_layout_html,
)
from mini.viz.block_table import (
    BlockTableView,
    block_table_view,
    block_table_widget,
    plot_block_table,
    render_block_table_html,
)
from mini.viz.recording import EngineRecording, KVSnapshot, record_run, snapshot_engine

__all__ = [
    "BatchLayout", "BlockTableView", "EngineRecording", "KVSnapshot", "batch_layout",
    "batch_layout_from_inputs", "batch_layout_widget", "block_table_view", "block_table_widget",
    "plot_batch_layout", "plot_block_table", "record_run", "render_batch_layout_html",
    "render_block_table_html", "snapshot_engine",
]
