"""Phase 10's checks reject plausible wrong answers (issues 24 and 26): each fails with the default seeds and a
message that locates the bug."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

WRONG = [
    # ---- hash_block_tokens
    Wrong("hash_block_tokens", "Python's builtin hash", expect="not a int",
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
    Wrong("hash_block_tokens", "the key in another order (tokens first)", expect="the parent's hash first",
          edit=("hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))",
                "hash_function((tuple(curr_block_token_ids), parent_block_hash, extra_keys))")),
    Wrong("hash_block_tokens", "a pair when there are no extra keys", expect="extra_keys included even when it is None",
          edit=("    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))",
                ("    if extra_keys is None:\n        return hash_function((parent_block_hash, tuple(curr_block_token_ids)))\n"
                 "    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))"))),
    Wrong("hash_block_tokens", "a hex string, not the digest", expect="not a str",
          edit=("extra_keys))", "extra_keys)).hex()")),
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
    Wrong("hash_request_tokens", "re-hashes every block each call (correct list, wasted work)",
          expect="hash only the blocks known_hashes lacks",
          source='''
def hash_request_tokens(block_size, token_ids, cache_salt=None, hash_function=sha256, known_hashes=None, *,
                        hash_block_tokens=hash_block_tokens):
    hashes = [] if known_hashes is None else known_hashes
    hashes.clear()
    for index in range(len(token_ids) // block_size):
        parent = hashes[-1] if hashes else None
        block = token_ids[index * block_size:(index + 1) * block_size]
        hashes.append(hash_block_tokens(hash_function, parent, block, block_extra_keys(index, cache_salt)))
    return hashes
'''),
    Wrong("hash_request_tokens", "always sha256, not the hash_function argument", expect="hash_function argument",
          edit=("hash_block_tokens(hash_function, parent,", "hash_block_tokens(sha256, parent,")),
    Wrong("hash_request_tokens", "ignores the salt", expect="salted request's hashes must differ",
          edit=("block_extra_keys(index, cache_salt)", "block_extra_keys(index, None)")),
    Wrong("hash_request_tokens", "chains the first new block to nothing when known_hashes is given",
          expect="chain the next block to the last of them",
          source='''
def hash_request_tokens(block_size, token_ids, cache_salt=None, hash_function=sha256, known_hashes=None, *,
                        hash_block_tokens=hash_block_tokens):
    hashes = [] if known_hashes is None else known_hashes
    parent = None
    for index in range(len(hashes), len(token_ids) // block_size):
        block = token_ids[index * block_size:(index + 1) * block_size]
        parent = hash_block_tokens(hash_function, parent, block, block_extra_keys(index, cache_salt))
        hashes.append(parent)
    return hashes
'''),
    # ---- cache_full_blocks
    Wrong("cache_full_blocks", "the newest copy overwrites the map", expect="OLDEST",
          source='''
def cache_full_blocks(self, blocks, block_hashes, num_cached_blocks, num_full_blocks):
    for index in range(num_cached_blocks, num_full_blocks):
        block = blocks[index]
        if block.block_hash is not None:
            continue
        block.block_hash = block_hashes[index]
        self.cached_block_hash_to_block[block.block_hash] = block
'''),
    Wrong("cache_full_blocks", "a second copy is hashed but never registered", expect="duplicate",
          edit=("            self.duplicate_cached_blocks.setdefault(block.block_hash, {})[block.block_id] = block",
                "            pass")),
    Wrong("cache_full_blocks", "registers prefix hits again", expect="prefix hit",
          edit=("        if block.block_hash is not None:\n            continue\n", "")),
    Wrong("cache_full_blocks", "hash index counted from num_cached_blocks", expect="same index",
          edit=("block.block_hash = block_hashes[index]",
                "block.block_hash = block_hashes[index - num_cached_blocks]")),
    Wrong("cache_full_blocks", "publishes only the last full block", expect="[num_cached_blocks, num_full_blocks)",
          edit=("range(num_cached_blocks, num_full_blocks)",
                "range(max(num_cached_blocks, num_full_blocks - 1), num_full_blocks)")),
    Wrong("cache_full_blocks", "a duplicate is registered but gets no hash", expect="a duplicate holds its hash",
          source='''
def cache_full_blocks(self, blocks, block_hashes, num_cached_blocks, num_full_blocks):
    for index in range(num_cached_blocks, num_full_blocks):
        block = blocks[index]
        if block.block_hash is not None:
            continue
        block_hash = block_hashes[index]
        if block_hash in self.cached_block_hash_to_block:
            self.duplicate_cached_blocks.setdefault(block_hash, {})[block.block_id] = block
        else:
            block.block_hash = block_hash
            self.cached_block_hash_to_block[block_hash] = block
'''),
    Wrong("cache_full_blocks", "the cache takes a reference on each block", expect="no ref counts",
          edit=("        block.block_hash = block_hashes[index]\n",
                "        block.block_hash = block_hashes[index]\n        block.ref_cnt += 1\n")),
    # ---- get_computed_blocks
    Wrong("get_computed_blocks", "skips a miss instead of stopping", expect="stop at the first miss",
          edit=("            break\n", "            continue\n")),
    Wrong("get_computed_blocks", "lets the last token hit", expect="its last token is always computed",
          edit=("max_num_blocks = (request.num_tokens - 1) // self.block_size",
                "max_num_blocks = request.num_tokens // self.block_size")),
    Wrong("get_computed_blocks", "rounds the cap up", expect="its last token is always computed",
          edit=("max_num_blocks = (request.num_tokens - 1) // self.block_size",
                "max_num_blocks = -(-(request.num_tokens - 1) // self.block_size)")),
    Wrong("get_computed_blocks", "touches the hits", expect="changes nothing",
          edit=("        hits.append(block)\n",
                "        hits.append(block)\n        self.block_pool.touch([block])\n")),
    Wrong("get_computed_blocks", "reads the cache for a prompt-logprobs request", expect="prefix_cache_lookup_enabled",
          edit=("    if not self.prefix_cache_lookup_enabled(request):", "    if not self.enable_caching:")),
    Wrong("get_computed_blocks", "counts hit blocks, not tokens", expect="num_hit_tokens",
          edit=("    return hits, len(hits) * self.block_size", "    return hits, len(hits)")),
    Wrong("get_computed_blocks", "caps at the prompt, not the whole request (a resumed request hits less)",
          expect="its generated tokens are part of its sequence",
          edit=("max_num_blocks = (request.num_tokens - 1) // self.block_size",
                "max_num_blocks = (request.num_prompt_tokens - 1) // self.block_size")),
    Wrong("get_computed_blocks", "returns the hashes, not the blocks", expect="a list of the pool's KVCacheBlock",
          edit=("        hits.append(block)\n", "        hits.append(block_hash)\n")),
    Wrong("get_computed_blocks", "one block short (drops the last full block too)", expect="too few hits",
          edit=("max_num_blocks = (request.num_tokens - 1) // self.block_size",
                "max_num_blocks = request.num_tokens // self.block_size - 1")),
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
    Wrong("touch", "takes every block out of the free queue", expect="a block in use (ref_cnt >= 1)",
          edit=("        if block.ref_cnt == 0:\n            self.free_block_queue.remove(block)\n",
                "        self.free_block_queue.remove(block)\n")),
    Wrong("touch", "decides by the hash, not the ref count", expect="a free block (ref_cnt 0) leaves the free queue",
          edit=("        if block.ref_cnt == 0:\n", "        if block.block_hash is not None:\n")),
    # ---- _maybe_evict_cached_block
    Wrong("_maybe_evict_cached_block", "returns nothing", expect="True when the block had a hash",
          edit=("    block.reset_hash()\n    return True\n", "    block.reset_hash()\n")),
    Wrong("_maybe_evict_cached_block", "no copy takes the map's place", expect="OLDEST copy",
          edit=("        if copies:\n            self.cached_block_hash_to_block[block_hash] = copies.pop(next(iter(copies)))\n",
                "")),
    Wrong("_maybe_evict_cached_block", "the newest copy takes the map's place", expect="OLDEST copy",
          edit=("copies.pop(next(iter(copies)))", "copies.pop(next(reversed(copies)))")),
    Wrong("_maybe_evict_cached_block", "the block keeps its hash", expect="forgets its hash",
          edit=("    block.reset_hash()\n", "")),
    Wrong("_maybe_evict_cached_block", "True for a block with no hash", expect="True when the block had a hash",
          edit=("        return False\n", "        return True\n")),
    Wrong("_maybe_evict_cached_block", "an emptied duplicates entry stays", expect="no copies",
          edit=("    if not copies:\n        self.duplicate_cached_blocks.pop(block_hash, None)\n", "")),
    Wrong("_maybe_evict_cached_block", "evicting a copy drops the map's block", expect="OLDEST copy",
          source='''
def _maybe_evict_cached_block(self, block):
    block_hash = block.block_hash
    if block_hash is None:
        return False
    self.cached_block_hash_to_block.pop(block_hash, None)
    copies = self.duplicate_cached_blocks.pop(block_hash, {})
    copies.pop(block.block_id, None)
    if copies:
        self.cached_block_hash_to_block[block_hash] = copies.pop(next(iter(copies)))
        if copies:
            self.duplicate_cached_blocks[block_hash] = copies
    block.reset_hash()
    return True
'''),
    Wrong("_maybe_evict_cached_block", "compares blocks by hash, not identity", expect="OLDEST copy",
          edit=("    if self.cached_block_hash_to_block.get(block_hash) is block:",
                "    if self.cached_block_hash_to_block.get(block_hash).block_hash == block_hash:")),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("10_prefix_caching", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
