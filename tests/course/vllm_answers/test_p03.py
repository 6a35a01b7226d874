"""vLLM v0.33.0's own code for phase 03 passes phase 03's checks (its call shape adapted, nothing else).

* `store_kv`: vLLM writes the cache with `reshape_and_cache_flash`, a CUDA kernel (csrc/cache_kernels.cu), or
  its Triton twin `reshape_and_cache_kernel_flash` (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py),
  which runs here under Triton's interpreter (skipped without Triton) on the two sides `kv_cache[0]` and
  `kv_cache[1]` of mini's cache.
* `gather_kv` has no vLLM counterpart (vLLM's kernels read the paged cache in place, never gathering it), and
  `paged_attention`'s counterparts are GPU kernels only (FlashAttention's `flash_attn_varlen_func`; the Triton
  `unified_attention` of vllm/v1/attention/ops/triton_unified_attention.py, too entangled with vLLM's platform
  code to launch here).
"""

from tests.course.fidelity import check_of
from tests.course.vllm_kernels import vllm_store_kv


def test_vllm_reshape_and_cache_kernel_passes_check_store_kv():
    check_of("03_paged_attention", "store_kv")(vllm_store_kv())
