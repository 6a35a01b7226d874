"""vLLM v0.33.0's own code for phase 00 passes phase 00's checks (its call shape adapted, nothing else).

* `kv_bytes_per_block`: a layer's page is `AttentionSpec.page_size_bytes` (vllm/v1/kv_cache_interface.py, with
  `num_heads`, `state_content_size_bytes`, `unpadded_page_size_bytes` and `KVCacheSpec.num_states` /
  `get_num_kernel_states`, all vLLM's own, on a plain object carrying the spec's fields and its defaults);
  its head size, KV heads and layer count come from `ModelArchConfigConvertorBase` in
  vllm/transformers_utils/model_arch_config_convertor.py (`get_head_size`, `get_total_num_kv_heads`, ...,
  with vLLM's `getattr_iter` and `CONFIG_FIELD_ALIASES`), run on the check's transformers config; dtype sizes
  from `get_dtype_size` (vllm/utils/torch_utils.py). The wrapper sums the page over the layers, as
  `_get_kv_cache_bytes_per_block` (vllm/v1/core/kv_cache_planning.py) does for one KV-cache group.
* `generate_naive` and `generate_with_kv_cache` have no vLLM counterpart.
"""

import ast

import pytest
import torch

from tests.course.fidelity import check_of, vllm_definition, vllm_source_root

PHASE = "00_autoregressive_loop"
CONVERTOR = "vllm/transformers_utils/model_arch_config_convertor.py"
SPEC_PROPERTIES = ("AttentionSpec.num_heads", "AttentionSpec.state_content_size_bytes",
                   "AttentionSpec.unpadded_page_size_bytes", "AttentionSpec.page_size_bytes",
                   "KVCacheSpec.num_states", "KVCacheSpec.get_num_kernel_states")
CONVERTOR_METHODS = ("get_head_size", "get_total_num_kv_heads", "get_total_num_attention_heads",
                     "get_hidden_size", "get_num_hidden_layers")


def _config_field_aliases():
    """vLLM's CONFIG_FIELD_ALIASES (vllm/transformers_utils/config.py), a literal dict read from its source."""
    if vllm_source_root() is None:
        pytest.skip("set MINI_VLLM_SOURCE to an unpacked vLLM v0.33.0 tree (the folder holding vllm/)")
    source = (vllm_source_root() / "vllm/transformers_utils/config.py").read_text(encoding="utf-8")
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "CONFIG_FIELD_ALIASES":
            return ast.literal_eval(node.value)
    raise AssertionError("CONFIG_FIELD_ALIASES not found")


def vllm_kv_bytes_per_block():
    get_dtype_size = vllm_definition("vllm/utils/torch_utils.py", "get_dtype_size", {"torch": torch})
    getattr_iter = vllm_definition("vllm/config/utils.py", "getattr_iter", {"logger": None})
    convertor_namespace = {"getattr_iter": getattr_iter, "CONFIG_FIELD_ALIASES": _config_field_aliases()}

    class Convertor:
        """vLLM's convertor methods over a transformers config (not an MLA model: `is_deepseek_mla` False)."""

        def __init__(self, hf_config):
            self.hf_config = self.hf_text_config = hf_config

        def is_deepseek_mla(self):
            return False

    for method in CONVERTOR_METHODS:
        setattr(Convertor, method,
                vllm_definition(CONVERTOR, f"ModelArchConfigConvertorBase.{method}", convertor_namespace))

    class LayerSpec:
        """The fields of vLLM's FullAttentionSpec for one Llama layer (defaults as vLLM's), its page-size
        properties vLLM's own."""

        tokens_per_state = 1
        num_head_slots = None
        state_content_bytes = None
        page_size_padded = None

        def __init__(self, block_size, num_kv_heads, head_size, dtype):
            self.block_size, self.num_kv_heads, self.dtype = block_size, num_kv_heads, dtype
            self.head_size = self.head_size_v = head_size

    spec_namespace = {"get_dtype_size": get_dtype_size}
    for qualname in SPEC_PROPERTIES:
        function = vllm_definition("vllm/v1/kv_cache_interface.py", qualname, spec_namespace)
        name = qualname.split(".")[1]
        setattr(LayerSpec, name, function if name == "get_num_kernel_states" else property(function))

    def kv_bytes_per_block(config, hf_config):
        model = Convertor(hf_config)
        layer = LayerSpec(config.block_size, model.get_total_num_kv_heads(), model.get_head_size(),
                          config.torch_dtype)
        return sum(layer.page_size_bytes for _ in range(model.get_num_hidden_layers()))

    return kv_bytes_per_block


def test_vllm_page_size_passes_check_kv_bytes_per_block():
    check_of(PHASE, "kv_bytes_per_block")(vllm_kv_bytes_per_block())
