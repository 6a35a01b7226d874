"""The worker side of the engine: persistent batch, input preparation, model execution.

Mirrors vllm/v1/worker/ (gpu_input_batch.py, gpu_model_runner.py); what a step hands back to the
scheduler, `ModelRunnerOutput`, lives one layer down in mini/runner_outputs.py (vLLM: vllm/v1/outputs.py).
Submodules are imported where used (`from mini.worker.model_runner import ModelRunner`) so importing
this package stays cheap.
"""

from __future__ import annotations
