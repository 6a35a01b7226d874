"""Phase 12's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

NGRAM_LATEST = '''
def propose_ngram(token_ids, min_n, max_n, k, max_model_len=None):
    num_tokens = len(token_ids)
    if max_model_len is not None:
        k = min(k, max_model_len - num_tokens)
    if k <= 0:
        return []
    for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):
        suffix = list(token_ids[num_tokens - n:])
        for start in reversed(range(num_tokens - n)):
            if list(token_ids[start:start + n]) == suffix:
                return [int(t) for t in token_ids[start + n:start + n + k]]
    return []
'''

RESIDUAL_ONLY_AT_DRAFT = '''
def compute_residual_probs(target_probs, draft_probs, draft_token_ids):
    rows = torch.arange(target_probs.shape[0])
    residual = target_probs.clone()
    q = 1.0 if draft_probs is None else draft_probs[rows, draft_token_ids]
    residual[rows, draft_token_ids] = (residual[rows, draft_token_ids] - q).clamp_min(0.0)
    return residual / residual.sum(dim=-1, keepdim=True)
'''

REJECTION_FROM_P = ("replacement = None if accepted else int(torch.multinomial(residual[t], 1, generator=generator))",
                    "replacement = None if accepted else int(torch.multinomial(target_probs[t], 1, generator=generator))")

WRONG = [
    # propose_ngram
    Wrong("propose_ngram", "the most recent match wins", source=NGRAM_LATEST, expect="EARLIEST match"),
    Wrong("propose_ngram", "the shortest n first",
          edit=("for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):",
                "for n in range(min_n, min(max_n, num_tokens - 1) + 1):"), expect="try n = max_n, max_n - 1"),
    Wrong("propose_ngram", "the suffix matches itself",
          edit=("for start in range(num_tokens - n):", "for start in range(num_tokens - n + 1):"),
          expect="a match must start before the suffix itself"),
    Wrong("propose_ngram", "min_n itself never tried",
          edit=("for n in range(min(max_n, num_tokens - 1), min_n - 1, -1):",
                "for n in range(min(max_n, num_tokens - 1), min_n, -1):"), expect="try n = max_n, max_n - 1"),
    Wrong("propose_ngram", "one token short of max_model_len",
          edit=("k = min(k, max_model_len - num_tokens)", "k = min(k, max_model_len - num_tokens - 1)"),
          expect="never propose past max_model_len"),
    Wrong("propose_ngram", "max_model_len ignored",
          edit=("        k = min(k, max_model_len - num_tokens)",
                "        pass"), expect="never propose past max_model_len"),
    Wrong("propose_ngram", "proposes from the match's last token (off by one)",
          edit=("return [int(t) for t in token_ids[start + n:start + n + k]]",
                "return [int(t) for t in token_ids[start + n - 1:start + n - 1 + k]]"), expect="tokens that follow"),
    # compute_residual_probs
    Wrong("compute_residual_probs", "not normalised",
          edit=("return residual / residual.sum(dim=-1, keepdim=True)", "return residual"),
          expect="divided by its row sum"),
    Wrong("compute_residual_probs", "no clamp at zero",
          edit=("residual = (target_probs - draft_probs).clamp_min(0.0)", "residual = (target_probs - draft_probs)"),
          expect="max(0, p - q)"),
    Wrong("compute_residual_probs", "q = 0 when draft_probs is None",
          edit=("draft_probs[torch.arange(target_probs.shape[0]), draft_token_ids] = 1.0", "pass"),
          expect="one-hot at the row's draft token"),
    Wrong("compute_residual_probs", "writes into target_probs",
          edit=("residual = (target_probs - draft_probs).clamp_min(0.0)",
                "residual = target_probs.sub_(draft_probs).clamp_min_(0.0)"), expect="compute a new tensor"),
    Wrong("compute_residual_probs", "the whole tensor normalised at once",
          edit=("return residual / residual.sum(dim=-1, keepdim=True)", "return residual / residual.sum()"),
          expect="each ROW must sum to 1"),
    Wrong("compute_residual_probs", "q subtracted at the draft token only", source=RESIDUAL_ONLY_AT_DRAFT,
          expect="subtract it at every token"),
    Wrong("compute_residual_probs", "draft_probs ignored: q always one-hot",
          edit=("    if draft_probs is None:\n", "    if True:\n"), expect="when it is given, it is q"),
    # rejection_sample
    Wrong("rejection_sample", "recovered token drawn from p, not max(0, p - q)", edit=REJECTION_FROM_P,
          expect="emitted the rejected draft 0 as its recovered token"),
    Wrong("rejection_sample", "recovered token drawn from p: the hint names the residual, not the bonus",
          edit=REJECTION_FROM_P, expect="hint: after a rejection, sample the residual max(0, p - q)"),
    Wrong("rejection_sample", "accept with probability p(d), ignoring q",
          edit=("accepted = u < float(target_probs[t, draft]) / q", "accepted = u < float(target_probs[t, draft])"),
          expect="min(1, p / q) = 1 when p >= q"),
    Wrong("rejection_sample", "no bonus token",
          edit=("output[row, num_drafts] = int(bonus_token_ids[row])", "pass"), expect="bonus token"),
    Wrong("rejection_sample", "the request's generator ignored",
          edit=("generator = generators.get(row)", "generator = None"), expect="its own generator"),
    Wrong("rejection_sample", "greedy rows judged like random ones",
          edit=("if bool(is_greedy[row]):", "if False:"), expect="a greedy row"),
    Wrong("rejection_sample", "padded with 0 instead of -1",
          edit=("PLACEHOLDER_TOKEN_ID, dtype=torch.int64)", "0, dtype=torch.int64)"), expect="then -1"),
    Wrong("rejection_sample", "the bonus token appended after a rejection too",
          edit=("                output[row, position] = replacement\n                break",
                ("                output[row, position] = replacement\n"
                 "                output[row, position + 1] = int(bonus_token_ids[row])\n                break")),
          expect="the recovered token 2, then -1"),
    Wrong("rejection_sample", "every row reads the flat arrays from 0 (its offset forgotten)",
          edit=("t = start + position", "t = position"), expect="draft 2 accepted (argmax 2)"),
    # prepare_eagle_inputs
    Wrong("prepare_eagle_inputs", "no shift: each row reads its own token (the draft model's inputs)",
          edit=("next_id = target_token_ids[row + 1] if row + 1 < kept.stop else next_token_ids[b]",
                "next_id = target_token_ids[row]"), expect="the ids shift left by one inside each request"),
    Wrong("prepare_eagle_inputs", "the shift crosses into the next request; no next token",
          edit=("next_id = target_token_ids[row + 1] if row + 1 < kept.stop else next_token_ids[b]",
                "next_id = target_token_ids[min(row + 1, len(target_token_ids) - 1)]"),
          expect="a request's last input reads next_token_ids[b]"),
    Wrong("prepare_eagle_inputs", "requests without drafts reject 1 - s rows (a prompt chunk loses a row)",
          edit=("num_rejected = num_draft_tokens[b] + 1 - num_sampled_tokens[b] if num_draft_tokens[b] > 0 else 0",
                "num_rejected = num_draft_tokens[b] + 1 - num_sampled_tokens[b]"),
          expect="a request without drafts rejects nothing"),
    Wrong("prepare_eagle_inputs", "rejected = d - s (one too few)",
          edit=("num_rejected = num_draft_tokens[b] + 1 - num_sampled_tokens[b] if num_draft_tokens[b] > 0 else 0",
                "num_rejected = max(num_draft_tokens[b] - num_sampled_tokens[b], 0)"),
          expect="accepted s - 1 of them"),
    Wrong("prepare_eagle_inputs", "last_indices counted in the target's rows",
          edit=("last_indices.append(len(hidden_indices) - 1)", "last_indices.append(kept.stop - 1)"),
          expect="not among the target's T rows"),
    Wrong("prepare_eagle_inputs", "the positions shifted along with the ids",
          edit=("positions.append(int(target_positions[row]))", "positions.append(int(target_positions[row]) + 1)"),
          expect="only the ids move one place"),
    Wrong("prepare_eagle_inputs", "hidden_indices count the kept rows instead of naming target rows",
          edit=("hidden_indices.append(row)", "hidden_indices.append(len(hidden_indices))"),
          expect="not a count of the kept rows"),
    # compute_draft_slots
    Wrong("compute_draft_slots", "the first pass repeats the last position",
          edit=("torch.arange(1, num_steps + 1)", "torch.arange(num_steps)"),
          expect="one position after the input before it"),
    Wrong("compute_draft_slots", "no padding at max_model_len",
          edit=("past_end = positions >= max_model_len", "past_end = positions < 0"),
          expect="slot PADDING_SLOT_ID (-1)"),
    Wrong("compute_draft_slots", "padding from max_model_len + 1 on (off by one)",
          edit=("past_end = positions >= max_model_len", "past_end = positions > max_model_len"),
          expect="a position >= max_model_len has no slot"),
    Wrong("compute_draft_slots", "block numbers not clamped to the table",
          edit=("block_numbers = (positions // block_size).clamp_max(block_table.shape[1] - 1)",
                "block_numbers = positions // block_size"), expect="never read past the block table's last column"),
    Wrong("compute_draft_slots", "slot from the block index, not the block id",
          edit=("slots = block_table.long().gather(1, block_numbers) * block_size + positions % block_size",
                "slots = block_numbers * block_size + positions % block_size"),
          expect="block_table[b, position // block_size] * block_size"),
    Wrong("compute_draft_slots", "positions past the end kept (only the slot padded)",
          edit=("    positions = torch.where(past_end, 0, positions)\n", ""),
          expect="that pass gets position 0"),
    Wrong("compute_draft_slots", "every request reads the first request's blocks",
          edit=("block_table.long().gather(1, block_numbers)", "block_table.long()[0][block_numbers]"),
          expect="found through the request's row of block_table"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("12_spec_decode", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
