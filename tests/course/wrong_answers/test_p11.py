"""Plausible wrong answers to phase 11 (structured output): each must fail its check, saying where."""

from __future__ import annotations

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

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
          edit=("np.zeros((vocab_size + 31) // 32, dtype=np.uint32)",
                "np.zeros(max(vocab_size // 32, 1), dtype=np.uint32)"),
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
          expect="is the mask of logits row"),
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
    Wrong("subset_construction", "a class's targets not merged (last edge wins)",
          expect="first difference at dfa state",
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


# Issue 38: every exercise has at least five plausible wrong answers, each failing with words that locate it.
WRONG += [
    # epsilon_closure
    Wrong("epsilon_closure", "no visited set: loops forever on a cycle of epsilon edges", expect="did not stop",
          source='''
          def epsilon_closure(nfa, states):
              seen, stack = set(), list(states)
              while stack:
                  state = stack.pop()
                  seen.add(state)
                  stack.extend(nfa.epsilon[state])
              return frozenset(seen)
          '''),
    Wrong("epsilon_closure", "consumes the caller's list as its stack", expect="leave `states` as it was",
          edit=("    seen, stack = set(states), list(states)", "    seen, stack = set(states), states")),
    Wrong("epsilon_closure", "also follows byte edges", expect="follow epsilon edges alone",
          source='''
          def epsilon_closure(nfa, states):
              seen, stack = set(states), list(states)
              while stack:
                  state = stack.pop()
                  targets = list(nfa.epsilon[state]) + [target for _, _, target in nfa.edges[state]]
                  for target in targets:
                      if target not in seen:
                          seen.add(target)
                          stack.append(target)
              return frozenset(seen)
          '''),
    # subset_construction
    Wrong("subset_construction", "a state for the empty set instead of DEAD", expect="not to a state for the empty set",
          source='''
          def subset_construction(nfa, class_of):
              num_classes = max(class_of) + 1
              start = epsilon_closure(nfa, [nfa.start])
              ids, sets, table = {start: 0}, [start], []
              while len(table) < len(sets):
                  moves = {cls: set() for cls in range(num_classes)}
                  for nfa_state in sets[len(table)]:
                      for lo, hi, target in nfa.edges[nfa_state]:
                          for cls in range(class_of[lo], class_of[hi] + 1):
                              moves[cls].add(target)
                  row = [DEAD] * num_classes
                  for cls, targets in moves.items():
                      closure = epsilon_closure(nfa, targets)
                      if closure not in ids:
                          ids[closure] = len(sets)
                          sets.append(closure)
                      row[cls] = ids[closure]
                  table.append(row)
              return table, [nfa.accept in s for s in sets]
          '''),
    Wrong("subset_construction", "rows written in the order a LIFO stack pops the sets", expect="row d of the table",
          source='''
          def subset_construction(nfa, class_of):
              num_classes = max(class_of) + 1
              start = epsilon_closure(nfa, [nfa.start])
              ids, sets, table, todo = {start: 0}, [start], [], [start]
              while todo:
                  current = todo.pop()
                  moves = {}
                  for nfa_state in current:
                      for lo, hi, target in nfa.edges[nfa_state]:
                          for cls in range(class_of[lo], class_of[hi] + 1):
                              moves.setdefault(cls, set()).add(target)
                  row = [DEAD] * num_classes
                  for cls, targets in moves.items():
                      closure = epsilon_closure(nfa, targets)
                      if closure not in ids:
                          ids[closure] = len(sets)
                          sets.append(closure)
                          todo.append(closure)
                      row[cls] = ids[closure]
                  table.append(row)
              return table, [nfa.accept in s for s in sets]
          '''),
    Wrong("subset_construction", "an edge range misses its last class", expect="edges covering that class",
          edit=("for cls in range(class_of[lo], class_of[hi] + 1):", "for cls in range(class_of[lo], class_of[hi]):")),
    # allowed_token_ids
    Wrong("allowed_token_ids", "walks every token on its own (no shared prefixes)", expect="must share its walk",
          source='''
          def allowed_token_ids(self, state):
              allowed = []
              for token, data in enumerate(self.trie.byte_strings):
                  if not data:
                      continue
                  current = state
                  for byte in data:
                      current = self.dfa.transitions[current][byte]
                      if current == DEAD:
                          break
                  if current != DEAD:
                      allowed.append(token)
              if self.dfa.accepting[state] and self.eos_token_id is not None:
                  allowed.append(self.eos_token_id)
              return sorted(allowed)
          '''),
    Wrong("allowed_token_ids", "a token must end in an accepting state", expect="a token need not end the match",
          edit=("                allowed.extend(self.trie.token_ids[child])\n",
                ("                if self.dfa.accepting[next_state]:\n"
                 "                    allowed.extend(self.trie.token_ids[child])\n"))),
    Wrong("allowed_token_ids", "the DFA state is not carried along the walk",
          expect="carry the DFA state along the walk",
          edit=("stack.append((child, next_state))", "stack.append((child, dfa_state))")),
    Wrong("allowed_token_ids", "walks from the start state, not from `state`", expect="start the walk at `state`",
          edit=("allowed, stack = [], [(0, state)]", "allowed, stack = [], [(0, 0)]")),
    Wrong("allowed_token_ids", "adds EOS even when there is none (None in the list)", expect="not a token id",
          edit=("    if self.dfa.accepting[state] and self.eos_token_id is not None:",
                "    if self.dfa.accepting[state]:")),
    # pack_allowed
    Wrong("pack_allowed", "int32 words: 1 << 31 overflows", expect="bit 31 of a word is the int32 sign bit",
          source='''
          def pack_allowed(allowed_ids, vocab_size):
              words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)
              for token in allowed_ids:
                  words[token // 32] |= 1 << (token % 32)
              return words
          '''),
    Wrong("pack_allowed", "adds bits instead of OR-ing them (a repeated id carries)",
          expect="an id may come more than once",
          edit=("words[token // 32] |= np.uint32(1 << (token % 32))",
                "words[token // 32] += np.uint32(1 << (token % 32))")),
    Wrong("pack_allowed", "one word too many when vocab_size is a multiple of 32", expect="no spare word",
          edit=("np.zeros((vocab_size + 31) // 32, dtype=np.uint32)",
                "np.zeros(vocab_size // 32 + 1, dtype=np.uint32)")),
    # apply_token_bitmask_inplace
    Wrong("apply_token_bitmask_inplace", "writes into a copy (chained indexing)", expect="nothing changed in `logits`",
          edit=("    logits[rows] = logits[rows].masked_fill(~allowed, float(\"-inf\"))",
                "    logits[rows][~allowed] = float(\"-inf\")")),
    Wrong("apply_token_bitmask_inplace", "matches bitmask rows to logits rows in sorted order",
          expect="not sorted",
          edit=("    rows = torch.arange(logits.shape[0]) if indices is None else indices.to(torch.int64)",
                "    rows = torch.arange(logits.shape[0]) if indices is None else indices.to(torch.int64).sort().values")),
    Wrong("apply_token_bitmask_inplace", "tests bit 31 with a signed comparison", expect="bit 31 is the sign bit",
          edit=("    allowed = ((bitmask.to(torch.int32).unsqueeze(-1) >> shifts) & 1).bool().flatten(1)",
                "    allowed = ((bitmask.to(torch.int32).unsqueeze(-1) & (1 << shifts)) > 0).flatten(1)")),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("11_structured_output", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
