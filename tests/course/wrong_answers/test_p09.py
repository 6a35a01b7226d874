"""Plausible wrong answers to phase 09 (penalties and logits processors): each must fail its check."""

from __future__ import annotations

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

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
    Wrong("apply_all_penalties", "padding counted as the last token (ids clamped into a [N, V] table)",
          edit=("""        counts = torch.zeros((num_rows, vocab_size + 1), dtype=torch.long, device=logits.device)
        counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
        return counts[:, :vocab_size]""", """        counts = torch.zeros((num_rows, vocab_size), dtype=torch.long, device=logits.device)
        counts.scatter_add_(1, token_ids.clamp(max=vocab_size - 1), torch.ones_like(token_ids))
        return counts"""),
          expect="the padding id"),
    Wrong("apply_all_penalties", "repetition penalty once per history (twice for a token in prompt and output)",
          edit=("""    seen = (counts_of(prompt_token_ids) > 0) | (output_counts > 0)
    repetition = repetition_penalties.unsqueeze(1).expand_as(logits)
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    logits = torch.where(seen, penalized, logits)""", """    repetition = repetition_penalties.unsqueeze(1).expand_as(logits)
    for seen in (counts_of(prompt_token_ids) > 0, output_counts > 0):
        penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
        logits = torch.where(seen, penalized, logits)"""),
          expect="not once per history"),
    Wrong("apply_all_penalties", "frequency and presence subtracted before the repetition penalty",
          source='''
          def apply_all_penalties(logits, prompt_token_ids, output_token_ids, presence_penalties, frequency_penalties,
                                  repetition_penalties):
              num_rows, vocab_size = logits.shape

              def counts_of(token_ids):
                  counts = torch.zeros((num_rows, vocab_size + 1), dtype=torch.long)
                  counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
                  return counts[:, :vocab_size]

              output_counts = counts_of(output_token_ids)
              seen = (counts_of(prompt_token_ids) > 0) | (output_counts > 0)
              logits = logits - frequency_penalties.unsqueeze(1) * output_counts
              logits = logits - presence_penalties.unsqueeze(1) * (output_counts > 0)
              repetition = repetition_penalties.unsqueeze(1).expand_as(logits)
              penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
              return torch.where(seen, penalized, logits)
          ''', expect="subtracted after the repetition penalty"),
    Wrong("apply_all_penalties", "frequency counts the prompt too",
          edit=("    logits = logits - frequency_penalties.unsqueeze(1) * output_counts\n",
                "    logits = logits - frequency_penalties.unsqueeze(1) * (output_counts + counts_of(prompt_token_ids))\n"),
          expect="read the OUTPUT only"),
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
    Wrong("process_dict_updates", "a one-way move keeps the destination's old entry",
          edit=("a_state, b_state = entries.pop(a, None), entries.pop(b, None)",
                ("a_state, b_state = entries.pop(a, None), (entries.pop(b, None) "
                "if direction is MoveDirectionality.SWAP else None)")),
          expect="so it is discarded"),
    Wrong("process_dict_updates", "stores the None state of a request the processor ignores",
          edit=("""        if state is not None:
            entries[row] = state
            changed = True
        else:
            changed |= entries.pop(row, None) is not None""", """        entries[row] = state
        changed = True"""),
          expect="Store no entry when new_state returns None"),
    Wrong("process_dict_updates", "a SWAP done as two one-way moves",
          source='''
          def process_dict_updates(entries, batch_update, new_state):
              if batch_update is None:
                  return False
              changed = False
              for row in batch_update.removed:
                  changed |= entries.pop(row, None) is not None
              for row, params, prompt_ids, output_ids in batch_update.added:
                  state = new_state(params, prompt_ids, output_ids)
                  if state is not None:
                      entries[row] = state
                      changed = True
                  else:
                      changed |= entries.pop(row, None) is not None
              for a, b, direction in batch_update.moved:
                  pairs = [(a, b), (b, a)] if direction is MoveDirectionality.SWAP else [(a, b)]
                  for source, target in pairs:
                      state = entries.pop(source, None)
                      entries.pop(target, None)
                      if state is not None:
                          entries[target] = state
                      changed = True
              return changed
          ''', expect="A SWAP exchanges the two rows' entries"),
    Wrong("process_dict_updates", "a removed entry does not count as a change",
          edit=("    for row in batch_update.removed:\n        changed |= entries.pop(row, None) is not None\n",
                "    for row in batch_update.removed:\n        entries.pop(row, None)\n"),
          expect="'changed'"),
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
    Wrong("MinPLogitsProcessor", "rebuilds its tensors only when a request is added (stale after removes and moves)",
          edit=("if lp_state.process_dict_updates(self.min_p_by_row, batch_update, new_state):",
                "if lp_state.process_dict_updates(self.min_p_by_row, batch_update, new_state) and batch_update.added:"),
          expect="min_p"),
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
    Wrong("LogitBiasLogitsProcessor",
          "rebuilds its tensors only when a request is added (stale after removes and moves)",
          edit=("if lp_state.process_dict_updates(self.bias_by_row, batch_update, new_state):",
                "if lp_state.process_dict_updates(self.bias_by_row, batch_update, new_state) and batch_update.added:"),
          expect="logit_bias"),
    Wrong("LogitBiasLogitsProcessor", "rows numbered by their position in the dict, not by their row key",
          edit=("for row, biases in self.bias_by_row.items() for token, bias in biases.items()]",
                "for row, biases in enumerate(self.bias_by_row.values()) for token, bias in biases.items()]"),
          expect="logit_bias"),
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
    Wrong("MinTokensLogitsProcessor", "forgets EOS: holds back stop_token_ids only",
          edit=("stop_ids = stop_token_ids_of(params)", "stop_ids = set(params.stop_token_ids)"),
          expect="is the EOS of row"),
    Wrong("MinTokensLogitsProcessor", "drops EOS when the request sets ignore_eos",
          edit=("stop_ids = stop_token_ids_of(params)",
                "stop_ids = set(params.stop_token_ids) if params.ignore_eos else stop_token_ids_of(params)"),
          expect="EOS counts even with ignore_eos"),
    Wrong("MinTokensLogitsProcessor", "returns early when the update is None (never releases a row then)",
          edit=("        lp_state.process_dict_updates(self.state_by_row, batch_update, new_state)\n",
                ("        if batch_update is None:\n            return\n"
                "        lp_state.process_dict_updates(self.state_by_row, batch_update, new_state)\n")),
          expect="update_state is called every step"),
    Wrong("MinTokensLogitsProcessor", "counts the prompt towards min_tokens",
          edit=("if min_tokens > 0 and stop_ids and len(output_ids) < min_tokens:",
                "if min_tokens > 0 and stop_ids and len(prompt_ids) + len(output_ids) < min_tokens:"),
          expect="fewer than its min_tokens"),
    # condense
    Wrong("condense", "shifts the rows after a hole down (moves requests that could stay)",
          edit=("        last = len(self.req_ids) - 1\n",
                "        last = next(r for r in range(hole + 1, len(self.req_ids)) if self.req_ids[r] is not None)\n"),
          expect="it must stay put"),
    Wrong("condense", "does not record the moves",
          edit=("        self.batch_update_builder.moved_append((last, hole, MoveDirectionality.UNIDIRECTIONAL))\n",
                ""),
          expect="record every move you make"),
    Wrong("condense", "forgets req_id_to_index",
          edit=("        self.req_id_to_index[req_id] = hole\n", ""), expect="req_id_to_index"),
    Wrong("condense", "moves the last row even when it is a hole (a None id)",
          source='''
          def condense(self):
              for hole in [row for row, req_id in enumerate(self.req_ids) if req_id is None]:
                  last = len(self.req_ids) - 1
                  if hole >= last:
                      break
                  req_id = self.req_ids[last]
                  self.req_ids[hole], self.requests[hole] = req_id, self.requests[last]
                  self.req_ids.pop()
                  self.requests.pop()
                  self.req_id_to_index[req_id] = hole
                  self.batch_update_builder.moved_append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
              while self.req_ids and self.req_ids[-1] is None:
                  self.req_ids.pop()
                  self.requests.pop()
          ''', expect="is still a hole"),
    Wrong("condense", "records the move as (to_row, from_row)",
          edit=("moved_append((last, hole, MoveDirectionality.UNIDIRECTIONAL))",
                "moved_append((hole, last, MoveDirectionality.UNIDIRECTIONAL))"),
          expect="(from_row, to_row, ...)"),
    Wrong("condense", "records the move as a SWAP",
          edit=("moved_append((last, hole, MoveDirectionality.UNIDIRECTIONAL))",
                "moved_append((last, hole, MoveDirectionality.SWAP))"),
          expect="is not one-way"),
    Wrong("condense", "leaves the trailing holes",
          source='''
          def condense(self):
              while True:
                  hole = self.lowest_hole()
                  occupied = [row for row, req_id in enumerate(self.req_ids) if req_id is not None]
                  if hole is None or not occupied or hole > occupied[-1]:
                      return
                  last = occupied[-1]
                  req_id = self.req_ids[last]
                  self.req_ids[hole], self.requests[hole] = req_id, self.requests[last]
                  self.req_ids[last], self.requests[last] = None, None
                  self.req_id_to_index[req_id] = hole
                  self.batch_update_builder.moved_append((last, hole, MoveDirectionality.UNIDIRECTIONAL))
          ''', expect="drop the trailing None"),
    Wrong("condense", "moves req_ids but not requests",
          edit=(("        self.req_ids[hole], self.requests[hole] = req_id, self.requests[last]\n"
                "        self.req_ids[last], self.requests[last] = None, None\n"),
                "        self.req_ids[hole] = req_id\n        self.req_ids[last] = None\n"),
          expect="move both lists together"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("09_logits_processors", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)


def test_another_valid_condense_passes():
    """condense is a design exercise: any order of moves that keeps its invariants passes (here: the LOWEST row
    beyond the new end fills the lowest hole, where vLLM moves the highest), and so does vLLM's own way of
    recording it (each filled hole taken out of `removed` with pop_removed)."""
    from labs.checks.p09 import check_condense
    from mini.sample.logits_processor import MoveDirectionality

    def condense(self):
        size = len(self.req_id_to_index)
        holes = [row for row in range(size) if self.req_ids[row] is None]
        beyond = [row for row in range(size, len(self.req_ids)) if self.req_ids[row] is not None]
        for hole, source in zip(holes, beyond, strict=False):
            req_id = self.req_ids[source]
            self.req_ids[hole], self.requests[hole] = req_id, self.requests[source]
            self.req_ids[source], self.requests[source] = None, None
            self.req_id_to_index[req_id] = hole
            self.batch_update_builder.moved_append((source, hole, MoveDirectionality.UNIDIRECTIONAL))
            self.batch_update_builder.pop_removed()
        del self.req_ids[size:], self.requests[size:]

    check_condense(condense)
