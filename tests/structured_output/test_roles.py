"""The `structured_output` role: the grammar compiler's parts and the bitmask op are chosen when the engine is
built (mini/roles.py), and the engine built with them compiles and masks with them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from labs import plug
from mini import LLM, SamplingParams, roles
from mini.config import SHIPPED_MODEL_DIR, EngineConfig
from mini.sampling_params import StructuredOutputsParams
from mini.structured_output import GrammarOutput
from mini.structured_output.backend_mini import MiniBackend, MiniGrammarCompiler
from mini.structured_output.bitmask import BitmaskApplier, TorchBitmaskApplier, apply_token_bitmask_inplace
from mini.structured_output.dfa import build_dfa
from mini.structured_output.regex_nfa import build_nfa
from mini.structured_output.regex_parser import parse_regex
from mini.structured_output.token_index import TokenIndex, TokenTrie, pack_allowed, unpack_allowed

# It looks inside the engine (scheduler, runner, observers): its engines run in-process in either suite mode.
pytestmark = pytest.mark.inprocess_engine

COMPILER_PARTS = ("epsilon_closure", "subset_construction", "allowed_token_ids", "pack_allowed")


def choose(parts) -> EngineConfig:
    return EngineConfig(parts=parts)


def spying(calls: dict[str, int], part: str):
    reference = roles.reference(part)

    def spy(*args, **kwargs):
        calls[part] = calls.get(part, 0) + 1
        return reference(*args, **kwargs)

    return spy


def test_the_default_compiler_is_the_class_itself_and_holds_the_references():
    assert roles.resolve(EngineConfig(), MiniGrammarCompiler) is MiniGrammarCompiler
    assert roles.resolve(EngineConfig(), BitmaskApplier) is BitmaskApplier
    for part in COMPILER_PARTS:
        assert roles.home_class(part) is MiniGrammarCompiler
    assert roles.reference("apply_token_bitmask_inplace") is apply_token_bitmask_inplace
    assert roles.reference("pack_allowed") is pack_allowed


def test_a_compiler_with_a_replaced_epsilon_closure_uses_it_inside_subset_construction():
    calls: dict[str, int] = {}
    compiler = roles.resolve(choose({"epsilon_closure": spying(calls, "epsilon_closure")}), MiniGrammarCompiler)()
    assert type(compiler).__bases__ == (MiniGrammarCompiler,)
    nfa = build_nfa(parse_regex("(a|b)*abb"))
    dfa = compiler.build_dfa(nfa)
    assert calls["epsilon_closure"] > 0          # bound into the reference subset_construction
    assert dfa.transitions == build_dfa(nfa).transitions and dfa.accepting == build_dfa(nfa).accepting


def test_a_compiler_builds_token_indexes_with_its_own_allowed_token_ids_and_pack_allowed():
    calls: dict[str, int] = {}
    chosen = choose({part: spying(calls, part) for part in ("allowed_token_ids", "pack_allowed")})
    compiler = roles.resolve(chosen, MiniGrammarCompiler)()
    dfa = build_dfa(build_nfa(parse_regex("ab|c")))
    vocab = [None, b"a", b"b", b"c", b"ab"]
    index = compiler.build_token_index(dfa, TokenTrie.build(vocab), len(vocab), 0)
    plain = TokenIndex(dfa, TokenTrie.build(vocab), len(vocab), 0)
    for state in range(dfa.num_states):
        assert unpack_allowed(index.mask(state), len(vocab)) == unpack_allowed(plain.mask(state), len(vocab))
    assert calls == {"allowed_token_ids": dfa.num_states, "pack_allowed": dfa.num_states}


def test_the_backend_builds_its_compiler_from_the_engines_config():
    class Tokenizer:   # MiniBackend reads the tokenizer only when it builds its trie
        pass

    assert type(MiniBackend(Tokenizer(), 8, 0).compiler) is MiniGrammarCompiler
    chosen = choose({"pack_allowed": pack_allowed})
    compiler_class = type(MiniBackend(Tokenizer(), 8, 0, chosen).compiler)
    assert compiler_class.__bases__ == (MiniGrammarCompiler,) and compiler_class.pack_allowed is pack_allowed


def test_the_bitmask_applier_masks_the_rows_of_the_constrained_requests():
    vocab_size = 40
    logits = torch.randn(3, vocab_size, generator=torch.Generator().manual_seed(0))
    bitmask = np.stack([pack_allowed([1, 33], vocab_size), pack_allowed([0], vocab_size)])
    grammar_output = GrammarOutput(structured_output_request_ids=["b", "c"], grammar_bitmask=bitmask)
    expected = apply_token_bitmask_inplace(logits.clone(), torch.from_numpy(bitmask), torch.tensor([2, 0]))
    got = BitmaskApplier("cpu")(logits.clone(), grammar_output, {"a": 1, "b": 2, "c": 0})
    assert torch.equal(got, expected)
    assert torch.isinf(got[2]).sum() == vocab_size - 2 and not torch.isinf(got[1]).any()


def test_a_replaced_bitmask_op_runs_in_the_applier_on_every_device():
    calls: dict[str, int] = {}
    applier_class = roles.resolve(choose({"apply_token_bitmask_inplace": spying(calls, "apply_token_bitmask_inplace")}),
                                  BitmaskApplier)
    assert applier_class.__bases__ == (TorchBitmaskApplier,)   # the reference applier, the op bound in
    bitmask = np.stack([pack_allowed([3], 8)])
    logits = applier_class("cpu")(torch.zeros(1, 8), GrammarOutput(["r"], bitmask), {"r": 0})
    assert calls == {"apply_token_bitmask_inplace": 1}
    assert torch.isinf(logits).sum() == 7
    if torch.cuda.is_available():   # the reference class has no Triton path: the replaced op runs on CUDA too
        assert applier_class("cuda").op is applier_class.apply_token_bitmask_inplace


@pytest.mark.skipif(not (SHIPPED_MODEL_DIR / "config.json").exists(), reason="no shipped model")
def test_an_engine_built_inside_plug_compiles_and_masks_with_the_plugged_parts():
    calls: dict[str, int] = {}
    parts = (*COMPILER_PARTS, "apply_token_bitmask_inplace")
    params = SamplingParams(temperature=0.0, max_tokens=12,
                            structured_outputs=StructuredOutputsParams(regex=r"[0-9]{3}-[a-c]{2}"))
    expected = LLM(max_num_batched_tokens=64).generate(["Code:"], params, use_tqdm=False)
    assert calls == {}
    with plug(**{part: spying(calls, part) for part in parts}):
        llm = LLM(max_num_batched_tokens=64)
    assert roles.replaced(llm.llm_engine.config, "structured_output") == parts
    got = llm.generate(["Code:"], params, use_tqdm=False)   # after the block: the engine kept its parts
    # A replaced subset_construction is a whole algorithm with its own closure: only the others are called.
    assert set(calls) == set(parts) - {"epsilon_closure"}
    assert got[0].outputs[0].text == expected[0].outputs[0].text
    assert got[0].outputs[0].token_ids == expected[0].outputs[0].token_ids
