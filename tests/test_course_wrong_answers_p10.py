"""Phase 10's checks reject plausible wrong answers (issue 24): each fails with the default seeds and a
message that locates the bug."""

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

WRONG = [
    # ---- hash_block_tokens
    Wrong("hash_block_tokens", "Python's builtin hash", expect="the given hash function",
          edit=("    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))",
                "    return hash((parent_block_hash, tuple(curr_block_token_ids), extra_keys))")),
    Wrong("hash_block_tokens", "always sha256", expect="the given hash function",
          edit=("    return hash_function((parent_block_hash", "    return sha256((parent_block_hash")),
    Wrong("hash_block_tokens", "no NONE_HASH for the first block", expect="NONE_HASH",
          edit=("        parent_block_hash = NONE_HASH\n", "        pass\n")),
    Wrong("hash_block_tokens", "hashes the token list, not a tuple", expect="tuple",
          edit=("tuple(curr_block_token_ids)", "list(curr_block_token_ids)")),
    Wrong("hash_block_tokens", "drops the extra keys", expect="extra_keys",
          edit=("tuple(curr_block_token_ids), extra_keys))", "tuple(curr_block_token_ids), None))")),
    # ---- hash_request_tokens
    Wrong("hash_request_tokens", "salt in every block", expect="first block",
          edit=("block_extra_keys(index, cache_salt)", "block_extra_keys(0, cache_salt)")),
    Wrong("hash_request_tokens", "hashes a partial last block", expect="FULL block",
          edit=("range(len(hashes), len(token_ids) // block_size)",
                "range(len(hashes), -(-len(token_ids) // block_size))")),
    Wrong("hash_request_tokens", "starts over instead of extending known_hashes", expect="in place",
          edit=("    hashes = [] if known_hashes is None else known_hashes",
                "    hashes = [] if known_hashes is None else list(known_hashes)")),
    Wrong("hash_request_tokens", "no chain (every parent None)", expect="chained",
          edit=("        parent = hashes[-1] if hashes else None", "        parent = None")),
    # ---- find_longest_cache_hit
    Wrong("find_longest_cache_hit", "skips a miss instead of stopping", expect="stop at the first miss",
          edit=("            break\n", "            continue\n")),
    Wrong("find_longest_cache_hit", "no length cap", expect="max_cache_hit_length // block_size",
          edit=("block_hashes[:max_cache_hit_length // block_size]", "block_hashes")),
    Wrong("find_longest_cache_hit", "rounds the cap up", expect="max_cache_hit_length // block_size",
          edit=("block_hashes[:max_cache_hit_length // block_size]",
                "block_hashes[:-(-max_cache_hit_length // block_size)]")),
    Wrong("find_longest_cache_hit", "touches the hits", expect="changes nothing",
          edit=("        hits.append(block)\n", "        hits.append(block)\n        block_pool.touch([block])\n")),
    # ---- touch
    Wrong("touch", "no null-block guard", expect="null block",
          edit=("        if block.is_null:\n            continue\n", "")),
    Wrong("touch", "guard only around remove (null ref_cnt grows)", expect="null block",
          source='''
def touch(self, blocks):
    for block in blocks:
        if block.ref_cnt == 0 and not block.is_null:
            self.free_block_queue.remove(block)
        block.ref_cnt += 1
'''),
    Wrong("touch", "never leaves the free queue", expect="leaves the free queue",
          edit=("            self.free_block_queue.remove(block)\n", "            pass\n")),
    Wrong("touch", "no extra reference for a block in use", expect="one more reference",
          edit=("        if block.ref_cnt == 0:\n            self.free_block_queue.remove(block)\n        block.ref_cnt += 1",
                "        if block.ref_cnt == 0:\n            self.free_block_queue.remove(block)\n            block.ref_cnt = 1")),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("10_prefix_caching", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
