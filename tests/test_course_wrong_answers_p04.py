"""Phase 04's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

ROTARY_IN_PLACE = '''
def apply_rotary(x, cos, sin):
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat((-second, first), dim=-1)
    x.mul_(cos[:, None, :])
    x.add_(rotated * sin[:, None, :])
    return x
'''

WRONG = [
    Wrong("rms_norm", "no + eps", edit=(".mean(-1, keepdim=True) + eps)", ".mean(-1, keepdim=True))"),
          expect="rms_norm (vs transformers' LlamaRMSNorm)"),
    Wrong("rms_norm", "weight applied before the cast back",
          edit=("return weight * x.to(dtype)", "return (weight * x).to(dtype)"), expect="not bit-identical"),
    Wrong("rms_norm", "mean over the first dim",
          edit=("x.pow(2).mean(-1, keepdim=True)", "x.pow(2).mean(0, keepdim=True)"),
          expect="rms_norm (vs transformers' LlamaRMSNorm)"),
    Wrong("rms_norm", "statistics in the input dtype",
          edit=("x = x.float()\n", "\n"), expect="bfloat16"),
    Wrong("apply_rotary", "rotates its input in place", source=ROTARY_IN_PLACE, expect="in place"),
    Wrong("apply_rotary", "rotate_half without the minus sign",
          edit=("torch.cat((-second, first), dim=-1)", "torch.cat((second, first), dim=-1)"),
          expect="apply_rotary (vs transformers"),
    Wrong("apply_rotary", "GPT-J interleaved pairs instead of halves",
          edit=("first, second = x.chunk(2, dim=-1)\n    rotated = torch.cat((-second, first), dim=-1)",
                ("first, second = x[..., ::2], x[..., 1::2]\n"
                 "    rotated = torch.stack((-second, first), dim=-1).flatten(-2)")),
          expect="apply_rotary (vs transformers"),
    Wrong("build_attention_metadata", "tensors where plain ints are specified",
          edit=("max_query_len=int(query_lens.max()),\n        max_seq_len=int(inputs.seq_lens.max()),",
                "max_query_len=query_lens.max(),\n        max_seq_len=inputs.seq_lens.max(),"),
          expect="plain Python int"),
    Wrong("build_attention_metadata", "num_actual_tokens counts requests",
          edit=("num_actual_tokens=int(inputs.input_ids.shape[0])",
                "num_actual_tokens=int(inputs.seq_lens.shape[0])"),
          expect="num_actual_tokens"),
    Wrong("build_attention_metadata", "max_query_len from seq_lens",
          edit=("max_query_len=int(query_lens.max())", "max_query_len=int(inputs.seq_lens.max())"),
          expect="max_query_len"),
    Wrong("run_model", "LM head over every row, then logits_indices",
          edit=("model.compute_logits(hidden[inputs.logits_indices])",
                "model.compute_logits(hidden)[inputs.logits_indices]"),
          expect="compute_logits"),
    Wrong("run_model", "logits of the first row of each request",
          edit=("hidden[inputs.logits_indices]", "hidden[inputs.query_start_loc[:-1].long()]"),
          expect="run_model logits"),
    Wrong("run_model", "fresh KV caches each call (nothing kept between steps)",
          edit=("model(inputs.input_ids, inputs.positions, kv_caches, metadata)",
                "model(inputs.input_ids, inputs.positions, [c.clone() for c in kv_caches], metadata)"),
          expect="run_model"),
    Wrong("update_states", "keeps running rows the scheduler did not schedule",
          edit=("        if req_id not in scheduler_output.num_scheduled_tokens:\n            batch.remove_request(req_id)",
                "        if req_id not in scheduler_output.num_scheduled_tokens:\n            pass"),
          expect="a running request the scheduler left out of this step leaves its row"),
    Wrong("update_states", "adds cached requests before new ones",
          edit=("    for state in to_add:\n", ("    for state in sorted(to_add, key=lambda s: s.req_id in "
                                               "{n.req_id for n in scheduler_output.scheduled_new_reqs}):\n")),
          expect="this step's new requests first"),
    Wrong("update_states", "replaces block ids instead of extending them",
          edit=("state.block_ids.extend(new_block_ids)", "state.block_ids = list(new_block_ids)"),
          expect="new_block_ids EXTEND its block_ids"),
    Wrong("update_states", "forgets to condense",
          edit=("    batch.condense()\n", "\n"), expect="condense() so that rows"),
    Wrong("update_states", "a running request left out of the step loses its state",
          edit=("        if req_id not in scheduler_output.num_scheduled_tokens:\n            batch.remove_request(req_id)",
                ("        if req_id not in scheduler_output.num_scheduled_tokens:\n            batch.remove_request(req_id)"
                 "\n            self.requests.pop(req_id)")),
          expect="keeps its CachedRequestState"),
    Wrong("update_states", "batch update never passed to the logits processors",
          edit=("    self.logitsprocs.update_state(batch.get_batch_update())\n", "\n"),
          expect="(the BatchUpdate lists the rows added, removed and moved this step)"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("04_model_runner", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
