"""Phase 01's checks reject plausible wrong answers (issue 24): each fails with the default seeds and a
message that locates the bug."""

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

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
