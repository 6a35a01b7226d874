"""vLLM v0.33.0's own code for phase 04 passes phase 04's checks (its call shape adapted, nothing else).

* `rms_norm`: `rms_norm` in vllm/ir/ops/layernorm.py, the PyTorch implementation `RMSNorm.forward_native`
  (vllm/model_executor/layers/layernorm.py) dispatches to.
* `apply_rotary`: `ApplyRotaryEmb.forward_static` (vllm/model_executor/layers/rotary_embedding/common.py),
  what `RotaryEmbedding.forward_native` runs on the rotated part of each head. vLLM's cos/sin carry
  head_size // 2 columns; the lab's carry transformers' duplicated halves, so the wrapper passes the first half.
* `build_attention_metadata`, `run_model` and `update_states` mirror methods of `GPUModelRunner` that need a
  GPU runner, so none of them runs here. (`logits_indices`, inline in `GPUModelRunner._prepare_inputs`, is
  no exercise of its own: phase 02's `prepare_inputs` computes it.)
"""

import torch

from tests.course.fidelity import check_of, vllm_definition

PHASE = "04_model_runner"


def test_vllm_rms_norm_passes_check_rms_norm():
    rms_norm = vllm_definition("vllm/ir/ops/layernorm.py", "rms_norm", {"torch": torch, "Tensor": torch.Tensor})
    check_of(PHASE, "rms_norm")(lambda x, weight, eps: rms_norm(x, weight, eps))


def test_vllm_rotary_passes_check_apply_rotary():
    rotary = vllm_definition("vllm/model_executor/layers/rotary_embedding/common.py",
                             "ApplyRotaryEmb.forward_static", {"torch": torch})

    def apply_rotary(x, cos, sin):
        half = cos.shape[-1] // 2
        return rotary(x, cos[:, :half], sin[:, :half], True)

    check_of(PHASE, "apply_rotary")(apply_rotary)
