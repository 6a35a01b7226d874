"""Phase 01's checks reject plausible wrong answers (issue 24): each fails with the default seeds and a
message that locates the bug."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

LIST_BACKED_QUEUE = '''
class FreeKVCacheBlockQueue:
    """A Python list in order, no links, no sentinels: right order, O(n) remove."""

    def __init__(self, blocks):
        self.blocks = list(blocks)
        self.num_free_blocks = len(self.blocks)

    def popleft(self):
        if not self.blocks:
            raise ValueError("empty")
        self.num_free_blocks -= 1
        return self.blocks.pop(0)

    def popleft_n(self, num_blocks):
        return [self.popleft() for _ in range(num_blocks)]

    def remove(self, block):
        self.blocks.remove(block)
        self.num_free_blocks -= 1

    def append(self, block):
        self.blocks.append(block)
        self.num_free_blocks += 1

    def append_n(self, blocks):
        for block in blocks:
            self.append(block)

    def prepend_n(self, blocks):
        self.blocks[:0] = list(blocks)
        self.num_free_blocks += len(blocks)

    def get_all_free_blocks(self):
        return list(self.blocks)
'''

# A linked list whose remove() first walks from the head to find the block (right links, O(n) remove).
WALKING_REMOVE = '''
        node = self.fake_free_list_head.next_free_block
        while node is not block:
            node = node.next_free_block
        before, after = block.prev_free_block, block.next_free_block'''

ASSERT_INSTEAD_OF_VALUE_ERROR = '''
def get_new_blocks(self, num_blocks):
    assert num_blocks <= self.get_num_free_blocks(), "not enough free blocks"
    blocks = self.free_block_queue.popleft_n(num_blocks)
    for block in blocks:
        block.ref_cnt = 1
    return blocks
'''

FEWER_BLOCKS_SILENTLY = '''
def get_new_blocks(self, num_blocks):
    blocks = self.free_block_queue.popleft_n(min(num_blocks, self.get_num_free_blocks()))
    for block in blocks:
        block.ref_cnt = 1
    return blocks
'''

NEW_BLOCKS_BEFORE_THE_HITS = '''
def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None):
    new_computed_blocks = list(new_computed_blocks or [])
    held = self.req_to_blocks.get(request.request_id, [])
    num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens
    num_to_allocate = max(0, cdiv(num_tokens, self.block_size) - len(held) - len(new_computed_blocks))
    num_free_hits = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
    if num_to_allocate > self.block_pool.get_num_free_blocks() - num_free_hits:
        return None
    blocks = self.req_to_blocks.setdefault(request.request_id, [])
    new_blocks = self.block_pool.get_new_blocks(num_to_allocate)   # before the hits leave the free queue
    if new_computed_blocks:
        self.block_pool.touch(new_computed_blocks)
        blocks.extend(new_computed_blocks)
    blocks.extend(new_blocks)
    return new_blocks
'''

# prepend_n spliced in with the list's last block: right for every non-empty list, an IndexError on [].
PREPEND_SPLICE_BODY = (
    """        before = self.fake_free_list_head
        for block in blocks:
            after = before.next_free_block
            before.next_free_block = block
            block.prev_free_block = before
            block.next_free_block = after
            after.prev_free_block = block
            self.num_free_blocks += 1
            before = block
""",
    """        old_first = self.fake_free_list_head.next_free_block
        before = self.fake_free_list_head
        for block in blocks:
            before.next_free_block = block
            block.prev_free_block = before
            before = block
        blocks[-1].next_free_block = old_first
        old_first.prev_free_block = blocks[-1]
        self.num_free_blocks += len(blocks)
""")

FREE_BLOCKS_IN_TWO_PASSES = '''
def free_blocks(self, ordered_blocks):
    for block in ordered_blocks:
        if not block.is_null:
            block.ref_cnt -= 1
    freed = [block for block in ordered_blocks if not block.is_null and block.ref_cnt == 0]
    self.free_block_queue.prepend_n([b for b in freed if b.block_hash is None or not self.enable_caching])
    self.free_block_queue.append_n([b for b in freed if b.block_hash is not None and self.enable_caching])
'''

FREE_BLOCKS_BY_INDEX = '''
def free_blocks(self, ordered_blocks):
    reuse_first, reuse_last = [], []
    for i in range(len(ordered_blocks)):
        block = ordered_blocks[i]
        if block.is_null:
            continue
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            (reuse_first if block.block_hash is None or not self.enable_caching else reuse_last).append(block)
    self.free_block_queue.prepend_n(reuse_first)
    self.free_block_queue.append_n(reuse_last)
'''

WRONG = [
    # ---- FreeKVCacheBlockQueue
    Wrong("FreeKVCacheBlockQueue", "python list, no links or sentinels", source=LIST_BACKED_QUEUE,
          expect="sentinel"),
    Wrong("FreeKVCacheBlockQueue", "remove walks the list", expect="O(1)",
          edit=("        before, after = block.prev_free_block, block.next_free_block", WALKING_REMOVE)),
    Wrong("FreeKVCacheBlockQueue", "remove keeps the removed block's links", expect="reset both to None",
          edit=("        block.prev_free_block = block.next_free_block = None\n", "")),
    Wrong("FreeKVCacheBlockQueue", "append forgets the back link", expect="prev_free_block",
          edit=("        block.prev_free_block = last\n", "")),
    Wrong("FreeKVCacheBlockQueue", "prepend_n reverses its blocks", expect="prepend_n",
          edit=("            before = block\n", "")),
    Wrong("FreeKVCacheBlockQueue", "popleft does not count", expect="num_free_blocks",
          edit=("        self.remove(first)\n        return first",
                "        self.remove(first)\n        self.num_free_blocks += 1\n        return first")),
    # ---- get_new_blocks
    Wrong("get_new_blocks", "pops from the tail", expect="HEAD",
          source='''
def get_new_blocks(self, num_blocks):
    if num_blocks > self.get_num_free_blocks():
        raise ValueError("not enough free blocks")
    blocks = self.free_block_queue.get_all_free_blocks()[::-1][:num_blocks]
    for block in blocks:
        self.free_block_queue.remove(block)
        block.ref_cnt = 1
    return blocks
'''),
    Wrong("get_new_blocks", "leaves ref_cnt at 0", expect="ref_cnt = 1",
          edit=("        block.ref_cnt = 1\n", "        pass\n")),
    Wrong("get_new_blocks", "pops until the queue runs out", expect="must not change anything",
          source='''
def get_new_blocks(self, num_blocks):
    blocks = []
    for _ in range(num_blocks):
        block = self.free_block_queue.popleft()     # raises ValueError half way, after popping some
        block.ref_cnt = 1
        blocks.append(block)
    return blocks
'''),
    # ---- free_blocks
    Wrong("free_blocks", "everything to the tail (older vLLM)", expect="HEAD",
          source='''
def free_blocks(self, ordered_blocks):
    for block in ordered_blocks:
        if block.is_null:
            continue
        if block.ref_cnt <= 0:
            raise ValueError("double free")
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            self.free_block_queue.append(block)
'''),
    Wrong("free_blocks", "prepends one by one (reversed)", expect="given order",
          source='''
def free_blocks(self, ordered_blocks):
    for block in ordered_blocks:
        if block.is_null:
            continue
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            if block.block_hash is None or not self.enable_caching:
                self.free_block_queue.prepend_n([block])
            else:
                self.free_block_queue.append(block)
'''),
    Wrong("free_blocks", "frees shared blocks too", expect="decrement ref_cnt",
          edit=("        if block.ref_cnt == 0:\n", "        if block.ref_cnt <= 1:\n")),
    Wrong("free_blocks", "ignores enable_caching", expect="enable_caching",
          edit=("            if block.block_hash is None or not self.enable_caching:",
                "            if block.block_hash is None:")),
    Wrong("free_blocks", "decrements the null block", expect="null",
          source='''
def free_blocks(self, ordered_blocks):
    reuse_first, reuse_last = [], []
    for block in ordered_blocks:
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            if block.block_hash is None or not self.enable_caching:
                reuse_first.append(block)
            else:
                reuse_last.append(block)
    self.free_block_queue.prepend_n(reuse_first)
    self.free_block_queue.append_n(reuse_last)
'''),
    # ---- allocate_slots
    Wrong("allocate_slots", "ignores num_new_computed_tokens", expect="num_new_computed_tokens",
          edit=("    num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens",
                "    num_tokens = request.num_computed_tokens + num_new_tokens")),
    Wrong("allocate_slots", "ignores the prefix hits", expect="hits",
          edit=("    if new_computed_blocks:\n", "    if False:\n")),
    Wrong("allocate_slots", "leaves an empty req_to_blocks entry after refusing", expect="req_to_blocks",
          edit=("    held = self.req_to_blocks.get(request.request_id, [])",
                "    held = self.req_to_blocks.setdefault(request.request_id, [])")),
    Wrong("allocate_slots", "counts free hits as free blocks", expect="free queue",
          edit=("    if num_to_allocate > self.block_pool.get_num_free_blocks() - num_free_hits:",
                "    if num_to_allocate > self.block_pool.get_num_free_blocks():")),
    Wrong("allocate_slots", "returns every block of the request", expect="NEW blocks",
          edit=("    return new_blocks\n", "    return blocks\n")),
    # ---- issue 38: plausible mistakes the checks must also locate
    Wrong("FreeKVCacheBlockQueue", "popleft on an empty queue returns None", expect="must raise ValueError",
          edit=('            raise ValueError("popleft() on an empty free-block queue")', "            return None")),
    Wrong("FreeKVCacheBlockQueue", "remove does not count", expect="num_free_blocks",
          edit=("        self.num_free_blocks -= 1\n", "")),
    Wrong("get_new_blocks", "refuses to hand out the last free block", expect="must succeed",
          edit=("    if num_blocks > self.get_num_free_blocks():", "    if num_blocks >= self.get_num_free_blocks():")),
    Wrong("get_new_blocks", "an assert instead of ValueError", source=ASSERT_INSTEAD_OF_VALUE_ERROR,
          expect="got AssertionError (an assert?)"),
    Wrong("get_new_blocks", "hands out fewer blocks instead of refusing", source=FEWER_BLOCKS_SILENTLY,
          expect="expected ValueError, nothing was raised"),
    Wrong("get_new_blocks", "returns the blocks last popped first", expect="in the wrong order",
          edit=("    return blocks\n", "    return blocks[::-1]\n")),
    Wrong("free_blocks", "with caching on, every uncached block goes to the tail", expect="HEAD",
          edit=("            if block.block_hash is None or not self.enable_caching:",
                "            if not self.enable_caching:")),
    Wrong("allocate_slots", "rounds the blocks needed down", expect="a partly filled last block counting whole",
          edit=("cdiv(num_tokens, self.block_size)", "num_tokens // self.block_size")),
    Wrong("allocate_slots", "forgets the tokens computed before", expect="computed before",
          edit=("    num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens",
                "    num_tokens = num_new_computed_tokens + num_new_tokens")),
    Wrong("allocate_slots", "new blocks taken before the hits are touched", source=NEW_BLOCKS_BEFORE_THE_HITS,
          expect="after the hits have been touched"),
    Wrong("FreeKVCacheBlockQueue", "prepend_n splices with blocks[-1]: fails on an empty list",
          edit=PREPEND_SPLICE_BODY, expect="prepend_n([]) must change nothing"),
    Wrong("free_blocks", "walks ordered_blocks twice", source=FREE_BLOCKS_IN_TWO_PASSES, expect="walk it once"),
    Wrong("free_blocks", "len() and indexing on ordered_blocks", source=FREE_BLOCKS_BY_INDEX,
          expect="no len() and no indexing"),
    # ---- issue 26: the state comparisons name the first differing entry, not two whole dicts
    Wrong("free_blocks", "cached blocks to the head too", expect="first difference at ['free_queue'][",
          edit=("            if block.block_hash is None or not self.enable_caching:", "            if True:")),
    Wrong("allocate_slots", "touches the hits twice", expect="first difference at ['ref_cnts'][",
          edit=("        self.block_pool.touch(new_computed_blocks)\n",
                "        self.block_pool.touch(new_computed_blocks)\n        self.block_pool.touch(new_computed_blocks)\n")),
    Wrong("FreeKVCacheBlockQueue", "append_n adds at the head", expect="first difference at ['free queue (head",
          edit=("        for block in blocks:\n            self.append(block)",
                "        self.prepend_n(list(blocks))")),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("01_paged_kv", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
