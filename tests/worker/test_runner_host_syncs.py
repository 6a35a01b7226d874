"""No device value is read into Python around the forward: the attention metadata's maxima and the sampler's
"is this row mid-prefill" come from the host's lists (vLLM keeps both on its CPU-side arrays).

On a GPU each such read (`int(t.max())`, `.tolist()`, `.item()`) makes the CPU wait for the device before it can
launch the forward, or before it can set up the sampler. On a CPU there is no device to wait for, so the test
records the conversions themselves: any tensor -> Python conversion made after the step's inputs are moved to
the device and before the forward starts, or after the forward and before the sampler runs. (The forward and the
sampler have their own rules: CUDA graphs, tests/worker/test_cuda_graph.py.)
"""

from __future__ import annotations

import pytest
import torch

from mini import LLM, SamplingParams
from mini.worker import prepare_inputs

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

CONVERSIONS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__")


@pytest.fixture
def conversions_outside_forward(monkeypatch):
    """Record every tensor -> Python conversion in the two windows around the forward."""
    recording = {"on": False}
    calls: list[str] = []
    for name in CONVERSIONS:
        original = getattr(torch.Tensor, name)

        def record(self, *args, _name=name, _original=original, **kwargs):
            if recording["on"]:
                calls.append(_name)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, record)

    original_to = prepare_inputs.PreparedInputs.to

    def to_device(self, device):
        moved = original_to(self, device)
        recording["on"] = True      # window 1: from here to the forward
        return moved
    monkeypatch.setattr(prepare_inputs.PreparedInputs, "to", to_device)
    return recording, calls


def test_no_device_reads_between_input_transfer_forward_and_sampler(tiny_llama_dir, conversions_outside_forward):
    recording, calls = conversions_outside_forward
    llm = LLM(model=str(tiny_llama_dir), skip_tokenizer_init=True, max_num_batched_tokens=16, block_size=4,
              num_gpu_blocks_override=64)
    runner = llm.llm_engine.model_runner
    forward, sample = runner._forward, runner._sample

    def watched_forward(*args, **kwargs):
        recording["on"] = False
        result = forward(*args, **kwargs)
        recording["on"] = True      # window 2: from the forward's end to the sampler
        return result

    def watched_sample(*args, **kwargs):
        recording["on"] = False
        return sample(*args, **kwargs)

    runner._forward, runner._sample = watched_forward, watched_sample
    # Prompts longer than the 16-token budget: mid-prefill rows (whose sample is discarded) mixed with decodes.
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (5, 23, 9)]
    outputs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
    assert [len(o.outputs[0].token_ids) for o in outputs] == [4, 4, 4]
    assert calls == [], f"device values read into Python around the forward: {calls}"
