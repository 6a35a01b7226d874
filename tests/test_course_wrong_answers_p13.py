"""Phase 13's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

MERGE_IN_PLACE = '''
def merge_delta_outputs(pending, new):
    by_index = {c.index: c for c in pending.outputs}
    for completion in new.outputs:
        old = by_index.get(completion.index)
        if old is None:
            pending.outputs.append(completion)
            continue
        old.text += completion.text
        old.token_ids.extend(completion.token_ids)
        if completion.logprobs is not None:
            old.logprobs = (old.logprobs or []) + list(completion.logprobs)
        old.finish_reason, old.stop_reason = completion.finish_reason, completion.stop_reason
        old.cumulative_logprob = completion.cumulative_logprob
    pending.finished = new.finished
    return pending
'''

WRONG = [
    # merge_delta_outputs
    Wrong("merge_delta_outputs", "new text replaces the unread text",
          edit=("text=old.text + completion.text", "text=completion.text"), expect="texts and token ids"),
    Wrong("merge_delta_outputs", "samples only in pending are dropped",
          edit=("by_index = {c.index: dataclasses.replace(c, token_ids=list(c.token_ids)) for c in pending.outputs}",
                "by_index = {}"), expect="a sample only in one of them is kept"),
    Wrong("merge_delta_outputs", "finish_reason kept from pending",
          edit=("by_index[completion.index] = dataclasses.replace(\n            completion,",
                "by_index[completion.index] = dataclasses.replace(\n            old,"),
          expect="finish_reason"),
    Wrong("merge_delta_outputs", "merges in place into pending", source=MERGE_IN_PLACE,
          expect="do not change pending's or new's"),
    # completion_stream_choices
    Wrong("completion_stream_choices", "choice index ignores the prompt",
          edit=("index=prompt_index * n + completion.index", "index=completion.index"),
          expect="choice index = prompt_index * n + sample index"),
    Wrong("completion_stream_choices", "choice index prompt_index + sample index",
          edit=("index=prompt_index * n + completion.index", "index=prompt_index + completion.index"),
          expect="choice index = prompt_index * n + sample index"),
    Wrong("completion_stream_choices", "an empty final chunk is skipped",
          edit=("if not completion.text and not completion.token_ids and completion.finish_reason is None:",
                "if not completion.text:"), expect="skip a sample with no text, no tokens and no finish_reason"),
    # num_blocks_for_budget
    Wrong("num_blocks_for_budget", "the null block added on top (the old rule)",
          edit=("return max(0, budget_bytes) // bytes_per_block", "return max(0, budget_bytes) // bytes_per_block + 1"),
          expect="do not add the null block on top"),
    Wrong("num_blocks_for_budget", "the null block taken away",
          edit=("return max(0, budget_bytes) // bytes_per_block",
                "return max(0, max(0, budget_bytes) // bytes_per_block - 1)"),
          expect="do not subtract the null block"),
    Wrong("num_blocks_for_budget", "a partial block rounded up",
          edit=("return max(0, budget_bytes) // bytes_per_block",
                "return -(-max(0, budget_bytes) // bytes_per_block)"),
          expect="a partial block was rounded up"),
    Wrong("num_blocks_for_budget", "true division",
          edit=("return max(0, budget_bytes) // bytes_per_block", "return max(0, budget_bytes) / bytes_per_block"),
          expect="use floor division"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("13_serving", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
