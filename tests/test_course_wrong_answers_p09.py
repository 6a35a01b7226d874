"""Plausible wrong answers to phase 09 (penalties and logits processors): each must fail its check."""

from __future__ import annotations

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

WRONG = [
    # apply_all_penalties
    Wrong("apply_all_penalties", "repetition penalty on the output only",
          edit=("seen = (counts_of(prompt_token_ids) > 0) | (output_counts > 0)", "seen = output_counts > 0"),
          expect="prompt OR the output"),
    Wrong("apply_all_penalties", "presence penalty counts the prompt too",
          edit=("return logits - presence_penalties.unsqueeze(1) * (output_counts > 0)",
                "return logits - presence_penalties.unsqueeze(1) * seen"),
          expect="presence"),
    Wrong("apply_all_penalties", "divides negative logits too",
          edit=("penalized = torch.where(logits > 0, logits / repetition, logits * repetition)",
                "penalized = logits / repetition"),
          expect="multiplied by r otherwise"),
    Wrong("apply_all_penalties", "a Python loop over rows",
          source='''
          def apply_all_penalties(logits, prompt_token_ids, output_token_ids, presence_penalties,
                                  frequency_penalties, repetition_penalties):
              vocab_size = logits.shape[1]
              for row in range(logits.shape[0]):
                  prompt = prompt_token_ids[row][prompt_token_ids[row] < vocab_size]
                  output = output_token_ids[row][output_token_ids[row] < vocab_size]
                  counts = torch.bincount(output, minlength=vocab_size).to(logits.dtype)
                  seen = torch.zeros(vocab_size, dtype=torch.bool)
                  seen[prompt] = True
                  seen[output] = True
                  r = repetition_penalties[row]
                  values = logits[row]
                  values = torch.where(seen, torch.where(values > 0, values / r, values * r), values)
                  values = values - frequency_penalties[row] * counts - presence_penalties[row] * (counts > 0)
                  logits[row] = values
              return logits
          ''', expect="no Python loop over rows"),
    # process_dict_updates
    Wrong("process_dict_updates", "moves before adds",
          source='''
          def process_dict_updates(entries, batch_update, new_state):
              if batch_update is None:
                  return False
              before = dict(entries)
              for row in batch_update.removed:
                  entries.pop(row, None)
              for a, b, direction in batch_update.moved:
                  a_state, b_state = entries.pop(a, None), entries.pop(b, None)
                  if a_state is not None:
                      entries[b] = a_state
                  if b_state is not None and direction is MoveDirectionality.SWAP:
                      entries[a] = b_state
              for row, params, prompt_ids, output_ids in batch_update.added:
                  state = new_state(params, prompt_ids, output_ids)
                  if state is not None:
                      entries[row] = state
                  else:
                      entries.pop(row, None)
              return entries != before
          ''', expect="then moves"),
    Wrong("process_dict_updates", "a SWAP moves one way only",
          edit=("if b_state is not None and direction is MoveDirectionality.SWAP:", "if False:"),
          expect="SWAP exchanges them"),
    Wrong("process_dict_updates", "keeps the stale entry of a replaced row",
          edit=("            changed |= entries.pop(row, None) is not None\n    for a, b",
                "            pass\n    for a, b"),
          expect="None drops a replaced row"),
    Wrong("process_dict_updates", "always reports a change",
          edit=("    return changed\n", "    return True\n"), expect="'changed'"),
    # MinPLogitsProcessor
    Wrong("MinPLogitsProcessor", "threshold on the logits, not on the probabilities",
          edit=("""        probs = rows_logits.softmax(dim=-1)
""", """        probs = rows_logits.clone()
"""),
          expect="PROBABILITIES of each row"),
    Wrong("MinPLogitsProcessor", "one threshold for the whole batch (the batch's top probability)",
          edit=("threshold = probs.amax(dim=-1, keepdim=True) * self.min_p", "threshold = probs.amax() * self.min_p"),
          expect="row's OWN largest"),
    Wrong("MinPLogitsProcessor", "drops ties with the threshold (<= instead of <)",
          edit=("masked_fill_(probs < threshold,", "masked_fill_(probs <= threshold,"), expect="strictly less"),
    Wrong("MinPLogitsProcessor", "threshold min_p alone, not min_p x the top probability",
          edit=("threshold = probs.amax(dim=-1, keepdim=True) * self.min_p", "threshold = self.min_p"),
          expect="min_p x the row's OWN largest"),
    Wrong("MinPLogitsProcessor", "declared not argmax-invariant",
          edit=("    def is_argmax_invariant(self):\n        ### BEGIN SOLUTION\n        return True",
                "    def is_argmax_invariant(self):\n        ### BEGIN SOLUTION\n        return False"),
          expect="argmax-invariant"),
    Wrong("MinPLogitsProcessor", "a Python loop over rows in apply",
          edit=("""        rows_logits = logits.index_select(0, self.rows)
        probs = rows_logits.softmax(dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * self.min_p
        return logits.index_copy_(0, self.rows, rows_logits.masked_fill_(probs < threshold, -float("inf")))""",
                """        for row, min_p in self.min_p_by_row.items():
            probs = logits[row].softmax(dim=-1)
            logits[row] = logits[row].masked_fill(probs < probs.max() * min_p, -float("inf"))
        return logits"""),
          expect="no Python loop over rows"),
    # LogitBiasLogitsProcessor
    Wrong("LogitBiasLogitsProcessor", "sets the logit to the bias instead of adding it",
          edit=("accumulate=True)", "accumulate=False)"), expect="ADD (not set)"),
    Wrong("LogitBiasLogitsProcessor", "follows only the adds (a finished or moved request's bias stays behind)",
          edit=("""        if lp_state.process_dict_updates(self.bias_by_row, batch_update, new_state):""",
                """        if batch_update is not None and batch_update.added:
            for row, params, prompt_ids, output_ids in batch_update.added:
                if new_state(params, prompt_ids, output_ids) is not None:
                    self.bias_by_row[row] = new_state(params, prompt_ids, output_ids)"""),
          expect="removes -> adds -> moves"),
    Wrong("LogitBiasLogitsProcessor", "declared argmax-invariant",
          edit=("    def is_argmax_invariant(self):\n        ### BEGIN SOLUTION\n        return False",
                "    def is_argmax_invariant(self):\n        ### BEGIN SOLUTION\n        return True"),
          expect="NOT argmax-invariant"),
    Wrong("LogitBiasLogitsProcessor", "a Python loop over rows in apply",
          edit=("""        return logits.index_put_(self.index, self.bias.to(logits.dtype), accumulate=True)""",
                """        for row, biases in self.bias_by_row.items():
            for token, bias in biases.items():
                logits[row, token] += bias
        return logits"""),
          expect="no Python loop over rows"),
    # MinTokensLogitsProcessor
    Wrong("MinTokensLogitsProcessor", "never drops the rows that reached min_tokens",
          edit=(("        for row in [r for r, (m, output_ids, _) in self.state_by_row.items() if len(output_ids) >= m]:\n"
                 "            del self.state_by_row[row]\n"), ""),
          expect="fewer than min_tokens"),
    Wrong("MinTokensLogitsProcessor", "copies the output list instead of keeping the live one",
          edit=("return (min_tokens, output_ids, stop_ids)", "return (min_tokens, list(output_ids), stop_ids)"),
          expect="grow by reference"),
    Wrong("MinTokensLogitsProcessor", "declared argmax-invariant",
          edit=("    def is_argmax_invariant(self):\n        ### BEGIN SOLUTION\n        return False",
                "    def is_argmax_invariant(self):\n        ### BEGIN SOLUTION\n        return True"),
          expect="is_argmax_invariant"),
    Wrong("MinTokensLogitsProcessor", "releases the stop tokens one token late",
          edit=("if len(output_ids) >= m]", "if len(output_ids) > m]"), expect="fewer than min_tokens"),
    # condense
    Wrong("condense", "moves the row right after the hole (shifts) instead of the highest row",
          edit=("        last = len(self.req_ids) - 1\n",
                "        last = next(r for r in range(hole + 1, len(self.req_ids)) if self.req_ids[r] is not None)\n"),
          expect="HIGHEST occupied row"),
    Wrong("condense", "does not record the moves",
          edit=("        self.batch_update_builder.moved_append((last, hole, MoveDirectionality.UNIDIRECTIONAL))\n",
                ""),
          expect="the step's BatchUpdate"),
    Wrong("condense", "forgets req_id_to_index",
          edit=("        self.req_id_to_index[req_id] = hole\n", ""), expect="req_id_to_index"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("09_logits_processors", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
