"""The model role's layer classes (mini/roles.py: `RowParallelLinear`, `VocabParallelEmbedding` of
`LlamaForCausalLM`): a model class built with them replaced builds every o_proj, down_proj and the embedding
from the replacement (the LM head keeps mini's), and the reference classes are used otherwise."""

from __future__ import annotations

import torch
from transformers import AutoConfig

from mini import roles
from mini.config import EngineConfig
from mini.model.llama import LlamaForCausalLM
from mini.model.parallel_linear import RowParallelLinear
from mini.model.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding


class CountingRow(RowParallelLinear):
    calls = 0

    def forward(self, x):
        CountingRow.calls += 1
        return super().forward(x)


class ZeroEmbedding(VocabParallelEmbedding):
    def forward(self, input_ids):
        return torch.zeros(*input_ids.shape, self.embedding_dim)


def test_the_layer_classes_are_parts_of_the_model_role():
    assert roles.role_of("RowParallelLinear").name == roles.role_of("VocabParallelEmbedding").name == "model"
    assert roles.reference("RowParallelLinear") is RowParallelLinear


def test_replaced_layer_classes_build_every_layer(tiny_llama_dir):
    hf_config = AutoConfig.from_pretrained(tiny_llama_dir)
    reference = LlamaForCausalLM(hf_config)
    assert type(reference.model.layers[0].self_attn.o_proj) is RowParallelLinear
    config = EngineConfig(parts={"RowParallelLinear": CountingRow, "VocabParallelEmbedding": ZeroEmbedding})
    model = roles.resolve(config, LlamaForCausalLM)(hf_config)
    layers = model.model.layers
    assert all(type(layer.self_attn.o_proj) is CountingRow and type(layer.mlp.down_proj) is CountingRow
               for layer in layers)
    assert type(model.model.embed_tokens) is ZeroEmbedding and type(model.lm_head) is ParallelLMHead
    with torch.no_grad():
        hidden = model.model.embed_tokens(torch.tensor([1, 2, 3]))
        out = layers[0].mlp(torch.randn(3, model.config.hidden_size))
    assert CountingRow.calls == 1 and out.shape == (3, model.config.hidden_size)
    assert torch.count_nonzero(hidden) == 0
