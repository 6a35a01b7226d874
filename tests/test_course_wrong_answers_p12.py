"""Phase 12's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

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
          edit=("        k = min(k, max_model_len - num_tokens)", "        pass"), expect="never propose past max_model_len"),
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
    # rejection_sample
    Wrong("rejection_sample", "recovered token drawn from p, not max(0, p - q)", edit=REJECTION_FROM_P,
          expect="sample the residual max(0, p - q)"),
    Wrong("rejection_sample", "accept with probability p(d), ignoring q",
          edit=("accepted = u < float(target_probs[t, draft]) / q", "accepted = u < float(target_probs[t, draft])"),
          expect="min(1, p / q) = 1 when p >= q"),
    Wrong("rejection_sample", "no bonus token",
          edit=("output[row, num_drafts] = int(bonus_token_ids[row])", "pass"), expect="bonus token"),
    Wrong("rejection_sample", "the request's generator ignored",
          edit=("generator = generators.get(row)", "generator = None"), expect="its own generator"),
    Wrong("rejection_sample", "greedy rows judged like random ones",
          edit=("if bool(is_greedy[row]):", "if False:"), expect="a greedy row"),
    # rollback_spec_tokens
    Wrong("rollback_spec_tokens", "every draft rolled back",
          edit=("num_rejected = num_scheduled_spec_tokens - num_accepted", "num_rejected = num_scheduled_spec_tokens"),
          expect="k - (g - 1) rejected drafts"),
    Wrong("rollback_spec_tokens", "all g tokens counted as accepted drafts",
          edit=("num_accepted = num_generated_tokens - 1", "num_accepted = num_generated_tokens"),
          expect="g - 1 accepted drafts"),
    Wrong("rollback_spec_tokens", "the rejected drafts added back",
          edit=("return num_computed_tokens - num_rejected, num_accepted",
                "return num_computed_tokens + num_rejected, num_accepted"), expect="so subtract them"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("12_spec_decode", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
