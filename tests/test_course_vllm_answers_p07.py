"""vLLM v0.33.0's own code for phase 07 passes phase 07's checks (its call shape adapted, nothing else).

* `store_kv` (the launcher): vLLM's `reshape_and_cache_kernel_flash`
  (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py), launched as `triton_reshape_and_cache_flash`
  launches it, under Triton's interpreter (skipped without Triton).
* `online_softmax_update` has no function of its own in vLLM: the same update is written inline in
  `kernel_unified_attention` (vllm/v1/attention/ops/triton_unified_attention.py).
* `_store_kv_kernel` and `_paged_decode_kernel` keep mini's kernel signatures, which vLLM's kernels do not
  share; `paged_decode`'s counterpart, `unified_attention` with its `kernel_unified_attention`, is too
  entangled with vLLM's platform code to launch here.
"""

from course_fidelity import check_of
from course_vllm_kernels import vllm_store_kv


def test_vllm_reshape_and_cache_kernel_passes_check_store_kv():
    check_of("07_attention_kernel", "store_kv")(vllm_store_kv())
