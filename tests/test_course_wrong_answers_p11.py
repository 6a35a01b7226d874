"""Plausible wrong answers to phase 11 (structured output): each must fail its check, saying where."""

from __future__ import annotations

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

WRONG = [
    # epsilon_closure
    Wrong("epsilon_closure", "leaves out the states themselves",
          source='''
          def epsilon_closure(nfa, states):
              seen, stack = set(), list(states)
              while stack:
                  for target in nfa.epsilon[stack.pop()]:
                      if target not in seen:
                          seen.add(target)
                          stack.append(target)
              return frozenset(seen)
          ''', expect="the states themselves"),
    Wrong("epsilon_closure", "follows one epsilon step only",
          source='''
          def epsilon_closure(nfa, states):
              return frozenset(set(states) | {t for s in states for t in nfa.epsilon[s]})
          ''', expect="transitively"),
    Wrong("epsilon_closure", "returns a set",
          edit=("    return frozenset(seen)", "    return seen"), expect="frozenset"),
    # subset_construction
    Wrong("subset_construction", "start state not closed",
          edit=("start = epsilon_closure(nfa, [nfa.start])", "start = frozenset([nfa.start])"),
          expect="closure of nfa.start"),
    Wrong("subset_construction", "targets not closed",
          edit=("closure = epsilon_closure(nfa, targets)", "closure = frozenset(targets)"),
          expect="subset_construction"),
    Wrong("subset_construction", "only the first class of an edge range",
          edit=("for cls in range(class_of[lo], class_of[hi] + 1):", "for cls in [class_of[lo]]:"),
          expect="edges covering that class"),
    # allowed_token_ids
    Wrong("allowed_token_ids", "EOS allowed in every state",
          edit=("if self.dfa.accepting[state] and self.eos_token_id is not None:",
                "if self.eos_token_id is not None:"),
          expect="accepting"),
    Wrong("allowed_token_ids", "stops after the first byte (no descent in the trie)",
          edit=("                stack.append((child, next_state))\n", ""), expect="last byte is reached alive"),
    Wrong("allowed_token_ids", "keeps walking from dead states",
          edit=("            if next_state != DEAD:", "            if True:"), expect="alive"),
    # pack_allowed
    Wrong("pack_allowed", "bits counted from the most significant end",
          edit=("words[token // 32] |= np.uint32(1 << (token % 32))",
                "words[token // 32] |= np.uint32(1 << (31 - token % 32))"),
          expect="bit t % 32 of word t // 32"),
    Wrong("pack_allowed", "floor instead of ceil for the number of words",
          edit=("np.zeros((vocab_size + 31) // 32, dtype=np.uint32)", "np.zeros(max(vocab_size // 32, 1), dtype=np.uint32)"),
          expect="out of bounds"),
    Wrong("pack_allowed", "int64 words",
          edit=("    return words.view(np.int32)", "    return words.astype(np.int64)"), expect="int32"),
    # apply_token_bitmask_inplace
    Wrong("apply_token_bitmask_inplace", "a per-token Python loop",
          source='''
          def apply_token_bitmask_inplace(logits, bitmask, indices=None):
              rows = range(logits.shape[0]) if indices is None else indices.tolist()
              for i, row in enumerate(rows):
                  for token in range(logits.shape[1]):
                      word = int(bitmask[i, token // 32]) if token // 32 < bitmask.shape[1] else 0
                      if not (word >> (token % 32)) & 1:
                          logits[row, token] = float("-inf")
              return logits
          ''', expect="no Python loop over tokens"),
    Wrong("apply_token_bitmask_inplace", "ignores indices (masks rows 0..n-1)",
          edit=("rows = torch.arange(logits.shape[0]) if indices is None else indices.to(torch.int64)",
                "rows = torch.arange(bitmask.shape[0])"),
          expect="rows `indices`"),
    Wrong("apply_token_bitmask_inplace", "not in place",
          source='''
          def apply_token_bitmask_inplace(logits, bitmask, indices=None):
              vocab_size = logits.shape[1]
              shifts = torch.arange(32, dtype=torch.int32)
              allowed = ((bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1).bool().flatten(1)[:, :vocab_size]
              rows = torch.arange(logits.shape[0]) if indices is None else indices.to(torch.int64)
              out = logits.clone()
              out[rows] = out[rows].masked_fill(~allowed, float("-inf"))
              return out
          ''', expect="in place"),
]


# Issue 26: tables and tensors are located (coordinates and a window), not dumped whole.
WRONG += [
    Wrong("subset_construction", "no state ever accepts", expect="the accepting flags",
          edit=("    return table, [nfa.accept in s for s in sets]", "    return table, [False] * len(sets)")),
    Wrong("subset_construction", "a class's targets not merged (last edge wins)", expect="first difference at dfa state",
          edit=("moves.setdefault(cls, set()).add(target)", "moves[cls] = {target}")),
    Wrong("pack_allowed", "each bit one token late", expect="first wrong token",
          edit=("words[token // 32] |= np.uint32(1 << (token % 32))",
                "words[token // 32] |= np.uint32(1 << ((token + 1) % 32))")),
    Wrong("apply_token_bitmask_inplace", "bits read from the most significant end",
          expect="first difference at logits row",
          edit=("    shifts = torch.arange(32, dtype=torch.int32)",
                "    shifts = torch.arange(31, -1, -1, dtype=torch.int32)")),
    Wrong("allowed_token_ids", "EOS in no state", expect="tokens wrongly left out",
          edit=("    if self.dfa.accepting[state] and self.eos_token_id is not None:", "    if False:")),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("11_structured_output", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
