"""Phase 02's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

PER_TOKEN_POSITIONS = '''
def compute_positions(num_computed_tokens, num_scheduled_tokens):
    return torch.tensor([start + offset for start, count in zip(num_computed_tokens, num_scheduled_tokens)
                         for offset in range(count)], dtype=torch.int64)
'''

PER_TOKEN_SLOTS = '''
def compute_slot_mapping(block_table, req_indices, positions, block_size):
    table = block_table.tolist()
    return torch.tensor([table[r][p // block_size] * block_size + p % block_size
                         for r, p in zip(req_indices.tolist(), positions.tolist())], dtype=torch.int64)
'''

CAT_PER_REQUEST = '''
def prepare_inputs(token_ids, num_computed_tokens, num_scheduled_tokens, block_ids, block_size):
    input_ids = torch.cat([torch.tensor(tokens[start:start + count])
                           for tokens, start, count in zip(token_ids, num_computed_tokens, num_scheduled_tokens)])
    query_start_loc = prep.compute_query_start_loc(num_scheduled_tokens)
    positions = prep.compute_positions(num_computed_tokens, num_scheduled_tokens)
    counts = torch.as_tensor(list(num_scheduled_tokens), dtype=torch.int64)
    req_indices = torch.repeat_interleave(torch.arange(len(counts)), counts)
    block_table = make_block_table(block_ids)
    seq_lens = [s + c for s, c in zip(num_computed_tokens, num_scheduled_tokens)]
    return PreparedInputs(
        input_ids=input_ids, positions=positions, query_start_loc=query_start_loc,
        seq_lens=torch.as_tensor(seq_lens, dtype=torch.int32),
        slot_mapping=prep.compute_slot_mapping(block_table, req_indices, positions, block_size),
        block_table=block_table, logits_indices=query_start_loc[1:].long() - 1)
'''

QSL_WITHOUT_THE_TOTAL = '''
def compute_query_start_loc(num_scheduled_tokens):
    counts = torch.as_tensor(list(num_scheduled_tokens), dtype=torch.int32)
    return (torch.cumsum(counts, 0) - counts).to(torch.int32)
'''

QSL_AS_A_LIST = '''
def compute_query_start_loc(num_scheduled_tokens):
    offsets = [0]
    for count in num_scheduled_tokens:
        offsets.append(offsets[-1] + count)
    return offsets
'''

QSL_INSERTS_INTO_THE_CALLERS_LIST = '''
def compute_query_start_loc(num_scheduled_tokens):
    num_scheduled_tokens.insert(0, 0)
    return torch.cumsum(torch.as_tensor(num_scheduled_tokens, dtype=torch.int32), 0).to(torch.int32)
'''

SLOTS_DIVIDE_POSITIONS_IN_PLACE = '''
def compute_slot_mapping(block_table, req_indices, positions, block_size):
    positions = positions.long()
    offsets = positions % block_size
    positions //= block_size
    return block_table[req_indices.long(), positions].long() * block_size + offsets
'''

SLOTS_BLOCK_SIZE_4 = '''
def compute_slot_mapping(block_table, req_indices, positions, block_size):
    positions = positions.long()
    return block_table[req_indices.long(), positions // 4].long() * 4 + positions % 4
'''

WRONG = [
    Wrong("compute_query_start_loc", "no leading 0",
          edit=("torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(counts, 0).to(torch.int32)])",
                "torch.cumsum(counts, 0).to(torch.int32)"),
          expect="compute_query_start_loc: wrong result"),
    Wrong("compute_query_start_loc", "int64 offsets",
          edit=("torch.cumsum(counts, 0).to(torch.int32)", "torch.cumsum(counts, 0).long()"),
          expect="dtype"),
    Wrong("compute_positions", "per-token Python loop", source=PER_TOKEN_POSITIONS, expect="is vectorized"),
    Wrong("compute_positions", "ignores num_computed_tokens",
          edit=("return computed[req_indices] + offsets", "return offsets"), expect="compute_positions: wrong"),
    Wrong("compute_positions", "offsets restart at the cumsum, not the first row",
          edit=("first_row = torch.cumsum(scheduled, 0) - scheduled", "first_row = torch.cumsum(scheduled, 0)"),
          expect="compute_positions: wrong"),
    Wrong("compute_slot_mapping", "per-token Python loop", source=PER_TOKEN_SLOTS, expect="is vectorized"),
    Wrong("compute_slot_mapping", "block id not scaled by block_size",
          edit=("return block_numbers * block_size + positions", "return block_numbers + positions"),
          expect="compute_slot_mapping: wrong result"),
    Wrong("compute_slot_mapping", "block index and offset swapped",
          edit=("block_table[req_indices.long(), positions // block_size]",
                "block_table[req_indices.long(), positions % block_size]"),
          expect="`compute_slot_mapping` raised"),
    Wrong("compute_slot_mapping", "int32 slots",
          edit=("return block_numbers * block_size + positions % block_size",
                "return (block_numbers * block_size + positions % block_size).int()"),
          expect="dtype"),
    Wrong("compute_positions", "positions start at 1", edit=("return computed[req_indices] + offsets",
                                                             "return computed[req_indices] + offsets + 1"),
          expect="first difference at [0]: expected 0, got 1"),
    Wrong("compute_slot_mapping", "every token read from request 0's row",
          edit=("block_table[req_indices.long(), positions // block_size]",
                "block_table[0, positions // block_size]"),
          expect="first difference at [5]: expected 12, got 4"),
    Wrong("prepare_inputs", "input ids are the last n tokens",
          edit=("for token in tokens[start:start + count]", "for token in tokens[-count:]"),
          expect="prepare_inputs(...).input_ids"),
    Wrong("prepare_inputs", "seq_lens without the cached tokens",
          edit=("seq_lens = [start + count for", "seq_lens = [count for"), expect="prepare_inputs(...).seq_lens"),
    Wrong("prepare_inputs", "logits at each request's first row",
          edit=("logits_indices=query_start_loc[1:].long() - 1", "logits_indices=query_start_loc[:-1].long()"),
          expect="prepare_inputs(...).logits_indices"),
    Wrong("prepare_inputs", "torch.cat of per-request tensors fails on an empty batch", source=CAT_PER_REQUEST,
          expect="`prepare_inputs` raised"),
    # ---- issue 38: more plausible mistakes, each located
    Wrong("compute_query_start_loc", "B offsets: the total left out", source=QSL_WITHOUT_THE_TOTAL,
          expect="the last entry is the total number of tokens"),
    Wrong("compute_query_start_loc", "a Python list", source=QSL_AS_A_LIST, expect="expected a torch.Tensor, got list"),
    Wrong("compute_query_start_loc", "inserts the leading 0 into the caller's list",
          source=QSL_INSERTS_INTO_THE_CALLERS_LIST, expect="changed its input num_scheduled_tokens in place"),
    Wrong("compute_positions", "int32 positions",
          edit=("return computed[req_indices] + offsets", "return (computed[req_indices] + offsets).int()"),
          expect="compute_positions dtype"),
    Wrong("compute_positions", "one arange over all tokens, not restarted per request",
          edit=("offsets = torch.arange(int(scheduled.sum())) - first_row[req_indices]",
                "offsets = torch.arange(int(scheduled.sum()))"),
          expect="first difference at [5]: expected 0, got 5"),
    Wrong("compute_slot_mapping", "divides positions in place", source=SLOTS_DIVIDE_POSITIONS_IN_PLACE,
          expect="changed its input positions in place"),
    Wrong("compute_slot_mapping", "the logical block number, not the block table's",
          edit=("block_numbers = block_table[req_indices.long(), positions // block_size].long()",
                "block_numbers = positions // block_size"),
          expect="the block ids come from block_table"),
    Wrong("compute_slot_mapping", "the whole position as the offset",
          edit=("return block_numbers * block_size + positions % block_size",
                "return block_numbers * block_size + positions"),
          expect="first difference at [4]: expected 8, got 12"),
    Wrong("compute_slot_mapping", "block_size 4 hard-coded (the worked example's)", source=SLOTS_BLOCK_SIZE_4,
          expect="the block size from the argument"),
    Wrong("prepare_inputs", "seq_lens from the whole token list",
          edit=("seq_lens = [start + count for start, count in zip(num_computed_tokens, num_scheduled_tokens)]",
                "seq_lens = [len(tokens) for tokens in token_ids]"),
          expect="under chunked prefill fewer than len(token_ids[i])"),
    Wrong("prepare_inputs", "input ids from the start of each token list",
          edit=("for token in tokens[start:start + count]", "for token in tokens[:count]"),
          expect="prepare_inputs(...).input_ids"),
    Wrong("prepare_inputs", "logits_indices one past each request's last row",
          edit=("logits_indices=query_start_loc[1:].long() - 1", "logits_indices=query_start_loc[1:].long()"),
          expect="below T"),
    Wrong("prepare_inputs", "int64 seq_lens",
          edit=("seq_lens=torch.as_tensor(seq_lens, dtype=torch.int32)", "seq_lens=torch.as_tensor(seq_lens)"),
          expect="prepare_inputs(...).seq_lens dtype"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("02_slot_mapping", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)


def test_a_failing_plug_names_the_request_and_the_first_differing_token():
    """Phases 02-05's "Plug it in" cells compare with expect_same_tokens: never a bare AssertionError."""
    from labs.checks.p02 import expect_same_tokens

    with pytest.raises(AssertionError) as failure:
        expect_same_tokens({"r0": [1, 2, 3], "r1": [4, 5]}, {"r0": [1, 2, 3], "r1": [4, 6]}, "the engine")
    assert "r1 generated different tokens from token 1 on; expected [4, 6], got [4, 5]" in str(failure.value)
    with pytest.raises(AssertionError, match="prompt 0 generated different tokens from token 2"):
        expect_same_tokens([[1, 2, 3]], [[1, 2, 4]], "the engine")
    expect_same_tokens([[1, 2]], [[1, 2]], "the engine")
