"""Phase 16's (16_lora) checks reject plausible wrong answers: each fails with the default seeds and a message that
locates the bug (the token row and its request, its slot, the column or output slice) and names the likely
mistake."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

MAPPING = "compute_token_lora_indices"
ADMIT = "admit_waiting_loras"
SHRINK_LINE = "buffer[rows] = scaling * (x[rows] @ lora_a[slot].T)"
EXPAND_LINE = "out[rows, slice_offset:slice_offset + n] += buffer[rows] @ lora_b[slot].T"

WRONG = [
    # ---- compute_token_lora_indices
    Wrong(MAPPING, "base requests mapped to slot 0", expect="runs the BASE model",
          edit=("torch.full((largest + 1,), -1, dtype=torch.int64)", "torch.full((largest + 1,), 0, dtype=torch.int64)")),
    Wrong(MAPPING, "the adapter id used as the slot", expect="not its SLOT",
          edit=("req_slots = slot_of_id[req_lora_ids]", "req_slots = torch.where(req_lora_ids > 0, req_lora_ids, -1)")),
    Wrong(MAPPING, "id - 1 used as the slot", expect="id - 1 is not its slot",
          edit=("req_slots = slot_of_id[req_lora_ids]",
                "req_slots = torch.where(req_lora_ids > 0, req_lora_ids - 1, -1)")),
    Wrong(MAPPING, "one entry per request", expect="one per request",
          edit=("return torch.repeat_interleave(req_slots, num_scheduled_tokens)", "return req_slots")),
    Wrong(MAPPING, "off by one at request boundaries", expect="off by one at a request boundary",
          edit=("return torch.repeat_interleave(req_slots, num_scheduled_tokens)",
                "ends = torch.cumsum(num_scheduled_tokens, 0)\n"
                "    return req_slots[torch.searchsorted(ends, torch.arange(int(ends[-1])))]")),
    Wrong(MAPPING, "the requests tiled instead of each repeated", expect="token row",
          edit=("return torch.repeat_interleave(req_slots, num_scheduled_tokens)",
                "return req_slots.repeat(int(num_scheduled_tokens.sum()) // len(req_slots) + 1)"
                "[:int(num_scheduled_tokens.sum())]")),
    Wrong(MAPPING, "int32 result", expect="dtype torch.int32",
          edit=("return torch.repeat_interleave(req_slots, num_scheduled_tokens)",
                "return torch.repeat_interleave(req_slots, num_scheduled_tokens).to(torch.int32)")),
    # ---- lora_shrink
    Wrong("lora_shrink", "scaling forgotten", expect="is missing",
          edit=(SHRINK_LINE, "buffer[rows] = x[rows] @ lora_a[slot].T")),
    Wrong("lora_shrink", "scaling applied twice", expect="applied twice",
          edit=(SHRINK_LINE, "buffer[rows] = scaling * scaling * (x[rows] @ lora_a[slot].T)")),
    Wrong("lora_shrink", "divides by the scaling", expect="do not divide",
          edit=(SHRINK_LINE, "buffer[rows] = (x[rows] @ lora_a[slot].T) / scaling")),
    Wrong("lora_shrink", "base rows through slot 0", expect="went through a real slot's A",
          edit=("rows = token_lora_indices == slot", "rows = token_lora_indices.clamp(min=0) == slot")),
    Wrong("lora_shrink", "another slot's A", expect="used slot",
          edit=(SHRINK_LINE, "buffer[rows] = scaling * (x[rows] @ lora_a[(slot + 1) % lora_a.shape[0]].T)")),
    Wrong("lora_shrink", "gathers with -1 and never masks", expect="reads the LAST slot",
          source='''
def lora_shrink(x, lora_a, token_lora_indices, scaling):
    return scaling * torch.einsum("th,trh->tr", x, lora_a[token_lora_indices])
'''),
    Wrong("lora_shrink", "A's columns instead of its rows", expect="ROW of A",
          source='''
def lora_shrink(x, lora_a, token_lora_indices, scaling):
    buffer = torch.zeros(x.shape[0], lora_a.shape[1], dtype=x.dtype)
    for slot in range(lora_a.shape[0]):
        rows = token_lora_indices == slot
        a = lora_a[slot] if lora_a.shape[1] != lora_a.shape[2] else lora_a[slot].T
        buffer[rows] = scaling * (x[rows] @ a.T)
    return buffer
'''),
    # ---- lora_expand
    Wrong("lora_expand", "assigns instead of adding", expect="ADD into out",
          edit=(EXPAND_LINE, "out[rows, slice_offset:slice_offset + n] = buffer[rows] @ lora_b[slot].T")),
    Wrong("lora_expand", "ignores the slice offset", expect="outside this projection's slice",
          edit=(EXPAND_LINE, "out[rows, :n] += buffer[rows] @ lora_b[slot].T")),
    Wrong("lora_expand", "base rows through slot 0", expect="no adapter (slot -1)",
          edit=("rows = token_lora_indices == slot", "rows = token_lora_indices.clamp(min=0) == slot")),
    Wrong("lora_expand", "another slot's B", expect="used slot",
          edit=(EXPAND_LINE,
                "out[rows, slice_offset:slice_offset + n] += buffer[rows] @ lora_b[(slot + 1) % lora_b.shape[0]].T")),
    Wrong("lora_expand", "returns a new tensor", expect="returned the right values in a new tensor",
          source='''
def lora_expand(out, buffer, lora_b, token_lora_indices, slice_offset):
    out = out.clone()
    n = lora_b.shape[1]
    for slot in range(lora_b.shape[0]):
        rows = token_lora_indices == slot
        out[rows, slice_offset:slice_offset + n] += buffer[rows] @ lora_b[slot].T
    return out
'''),
    Wrong("lora_expand", "adds twice", expect="added twice",
          edit=(EXPAND_LINE, "out[rows, slice_offset:slice_offset + n] += 2 * (buffer[rows] @ lora_b[slot].T)")),
    Wrong("lora_expand", "relies on zero buffer rows for base tokens", expect="no adapter (slot -1)",
          source='''
def lora_expand(out, buffer, lora_b, token_lora_indices, slice_offset):
    n = lora_b.shape[1]
    selected = lora_b[token_lora_indices.clamp(min=0)]
    out[:, slice_offset:slice_offset + n] += torch.einsum("tr,tnr->tn", buffer, selected)
    return out
'''),
    # ---- admit_waiting_loras
    Wrong(ADMIT, "a skipped request blocks the queue", expect="the walk goes on",
          edit=("continue   # skipped this step: it keeps its place in the queue", "break")),
    Wrong(ADMIT, "running requests' adapters not counted", expect="EVERY running request",
          edit=("in_use = {lora_id for lora_id in running_lora_ids if lora_id > 0}", "in_use = set()")),
    Wrong(ADMIT, "the base model counted as an adapter", expect="include the base model",
          edit=("in_use = {lora_id for lora_id in running_lora_ids if lora_id > 0}", "in_use = set(running_lora_ids)")),
    Wrong(ADMIT, "one adapter too many", expect="must wait",
          edit=("len(in_use) >= max_loras", "len(in_use) > max_loras")),
    Wrong(ADMIT, "admitted adapters not put in use", expect="admitted earlier in this walk",
          edit=("        in_use.add(lora_id)", "        pass")),
    Wrong(ADMIT, "no limit on the seats", expect="num_free_seats",
          edit=("if len(admitted) == num_free_seats:", "if False:")),
    Wrong(ADMIT, "base requests held back when the slots are full", expect="uses no slot",
          edit=("if lora_id > 0 and lora_id not in in_use and len(in_use) >= max_loras:",
                "if lora_id not in in_use and len(in_use) >= max_loras:")),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("16_lora", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
