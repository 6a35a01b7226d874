"""Phase 15's checks reject plausible wrong answers (issue 27): each fails with the default seeds and a message
that locates the bug (the rank, the iteration, the collective, or the rule that was broken)."""

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

WRONG = [
    # ---- RowParallelLinear.forward
    Wrong("RowParallelLinear", "adds the bias on every rank", expect="every rank added it",
          edit=("self.bias if self.tp_rank == 0 else None", "self.bias")),
    Wrong("RowParallelLinear", "no all-reduce: each rank keeps its partial sum",
          expect="RowParallelLinear.forward, rank 0 of 2",
          edit=("        return tensor_model_parallel_all_reduce(output) if self.reduce_results else output",
                "        return output")),
    Wrong("RowParallelLinear", "all-reduces even when reduce_results is False", expect="reduce_results",
          edit=("        return tensor_model_parallel_all_reduce(output) if self.reduce_results else output",
                "        return tensor_model_parallel_all_reduce(output)")),
    Wrong("RowParallelLinear", "all-reduces twice", expect="collective calls per rank",
          edit=("        return tensor_model_parallel_all_reduce(output) if self.reduce_results else output",
                ("        output = tensor_model_parallel_all_reduce(output)\n"
                 "        return tensor_model_parallel_all_reduce(output / 2)"))),
    # ---- VocabParallelEmbedding.forward
    Wrong("VocabParallelEmbedding", "does not zero the rows of out-of-shard ids", expect="ZERO their rows",
          edit=("F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)",
                "F.embedding(local_ids, self.weight)")),
    Wrong("VocabParallelEmbedding", "looks up global ids in the local shard", expect="IndexError",
          edit=("(input_ids - self.vocab_start_index).masked_fill(outside, 0)", "input_ids.masked_fill(outside, 0)")),
    Wrong("VocabParallelEmbedding", "masks input_ids in place", expect="in place",
          edit=("local_ids = (input_ids - self.vocab_start_index).masked_fill(outside, 0)",
                "local_ids = input_ids.sub_(self.vocab_start_index).masked_fill_(outside, 0)")),
    Wrong("VocabParallelEmbedding", "no all-reduce", expect="VocabParallelEmbedding.forward, rank 0 of 2",
          edit=("        return tensor_model_parallel_all_reduce(output)", "        return output")),
    # ---- QKVParallelLinear.weight_loader
    Wrong("QKVParallelLinear", "KV heads sharded by tp_rank (no replication)", expect="replicated",
          edit=('shard = self.tp_rank if shard_id == "q" else self.kv_partition.shard_rank', "shard = self.tp_rank")),
    Wrong("QKVParallelLinear", "every projection copied to the top of the fused matrix", expect="weight of rank 0",
          edit=("param.data.narrow(0, offset, size)", "param.data.narrow(0, 0, size)")),
    Wrong("QKVParallelLinear", "the fused matrix sliced as one block", expect="shard q, k and v SEPARATELY",
          source='''
class QKVParallelLinear(ReferenceQKVParallelLinear):
    def weight_loader(self, param, loaded_weight, shard_id=None):
        rows = param.shape[0]
        offset = {"q": 0, "k": self.split_sizes[0], "v": self.split_sizes[0] + self.split_sizes[1]}[shard_id]
        size = loaded_weight.shape[0] * rows // (self.total_num_heads + 2 * self.total_num_kv_heads) // self.head_size
        start = self.tp_rank * size
        with torch.no_grad():
            param.data.narrow(0, offset, min(size, rows - offset)).copy_(
                loaded_weight.narrow(0, start, min(size, rows - offset)))
'''),
    # ---- EngineCoreProc (the busy loop)
    Wrong("EngineCoreProc", "handles one message per iteration", expect="left in the input queue",
          edit=("""        while True:
            try:
                item = self.input_queue.get_nowait()
            except queue.Empty:
                return True
            if item is _SHUTDOWN:
                return False
            self._handle_client_request(*item)""", """        try:
            item = self.input_queue.get_nowait()
        except queue.Empty:
            return True
        if item is _SHUTDOWN:
            return False
        self._handle_client_request(*item)
        return True""")),
    Wrong("EngineCoreProc", "blocks on the queue even while requests run",
          expect="only when has_unfinished_requests() is False",
          edit=("""        if not self.engine_core.has_unfinished_requests():
            item = self.input_queue.get()""", """        if True:
            item = self.input_queue.get()""")),
    Wrong("EngineCoreProc", "steps and emits when idle", expect="iteration 6",
          edit=("""        if not self.engine_core.has_unfinished_requests():
            return
        outputs = self.engine_core.step()
        if outputs:""", """        outputs = self.engine_core.step()
        if True:""")),
    Wrong("EngineCoreProc", "ignores the shutdown on an idle core", expect="keep running",
          edit=("""            item = self.input_queue.get()
            if item is _SHUTDOWN:
                return False""", """            item = self.input_queue.get()
            if item is _SHUTDOWN:
                return True""")),
    # ---- get_core_engine_for_request
    Wrong("get_core_engine_for_request", "ties always go to core 0", expect="FIRST core",
          edit=("index = (eng_start_index + offset) % num_engines", "index = offset")),
    Wrong("get_core_engine_for_request", "the last of equal scores wins", expect="strict <",
          edit=("if score < best_score:", "if score <= best_score:")),
    Wrong("get_core_engine_for_request", "ignores this client's in-flight requests", expect="client_count * inflight",
          edit=("score = max(client_count * engine_inflight[index], waiting + running)", "score = waiting + running")),
    Wrong("get_core_engine_for_request", "no KV-cache pressure penalty", expect="kv_cache_usage - 0.5",
          edit=("            score += waiting * 6.0 * max(0.0, kv_cache_usage - 0.5)", "            pass")),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("15_across_processes", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
