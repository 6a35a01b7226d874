"""Phase 14's checks reject plausible wrong answers (issue 27): each fails with the default seeds and a message
that locates the bug (the rank, the iteration, the collective, or the rule that was broken)."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

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
    Wrong("RowParallelLinear", "the bias added after the all-reduce, on rank 0 only",
          expect="after the all-reduce every rank must hold the same full result",
          edit=(("        output = self.quant_method.apply(self, x, self.bias if self.tp_rank == 0 else None)\n"
                "        return tensor_model_parallel_all_reduce(output) if self.reduce_results else output"),
                ("        output = self.quant_method.apply(self, x)\n"
                "        output = tensor_model_parallel_all_reduce(output) if self.reduce_results else output\n"
                "        return output + self.bias if self.bias is not None and self.tp_rank == 0 else output"))),
    Wrong("RowParallelLinear", "no bias when the results are not reduced", expect="rank 0's partial result carries",
          edit=("        output = self.quant_method.apply(self, x, self.bias if self.tp_rank == 0 else None)",
                ("        if not self.reduce_results:\n"
                "            return self.quant_method.apply(self, x)\n"
                "        output = self.quant_method.apply(self, x, self.bias if self.tp_rank == 0 else None)"))),
    Wrong("RowParallelLinear", "multiplies by the weight untransposed", expect="raised RuntimeError",
          edit=("        output = self.quant_method.apply(self, x, self.bias if self.tp_rank == 0 else None)",
                ("        output = x @ self.weight\n"
                "        if self.bias is not None and self.tp_rank == 0:\n"
                "            output = output + self.bias"))),
    Wrong("RowParallelLinear", "multiplies self.weight itself, not through the layer's linear method",
          expect="self.quant_method.apply(self, x, bias)",
          edit=("        output = self.quant_method.apply(self, x, self.bias if self.tp_rank == 0 else None)",
                "        output = F.linear(x, self.weight, self.bias if self.tp_rank == 0 else None)")),
    # ---- VocabParallelEmbedding.forward
    Wrong("VocabParallelEmbedding", "does not zero the rows of out-of-shard ids", expect="instead of ZERO",
          edit=("F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0.0)",
                "F.embedding(local_ids, self.weight)")),
    Wrong("VocabParallelEmbedding", "looks up global ids in the local shard", expect="IndexError",
          edit=("(input_ids - self.vocab_start_index).masked_fill(outside, 0)", "input_ids.masked_fill(outside, 0)")),
    Wrong("VocabParallelEmbedding", "masks input_ids in place", expect="in place",
          edit=("local_ids = (input_ids - self.vocab_start_index).masked_fill(outside, 0)",
                "local_ids = input_ids.sub_(self.vocab_start_index).masked_fill_(outside, 0)")),
    Wrong("VocabParallelEmbedding", "no all-reduce", expect="VocabParallelEmbedding.forward, rank 0 of 2",
          edit=("        return tensor_model_parallel_all_reduce(output)", "        return output")),
    Wrong("VocabParallelEmbedding", "the range's end counted as inside", expect="end is exclusive",
          edit=("(input_ids >= self.vocab_end_index)", "(input_ids > self.vocab_end_index)")),
    Wrong("VocabParallelEmbedding", "the range's start counted as outside", expect="came out as zeros",
          edit=("(input_ids < self.vocab_start_index)", "(input_ids <= self.vocab_start_index)")),
    Wrong("VocabParallelEmbedding", "its own floor split of the vocabulary instead of the layer's range",
          expect="came out as zeros",
          edit=(("        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)\n"
                "        local_ids = (input_ids - self.vocab_start_index).masked_fill(outside, 0)"),
                ("        per_rank = self.org_vocab_size // self.tp_size\n"
                "        start, end = self.tp_rank * per_rank, (self.tp_rank + 1) * per_rank\n"
                "        outside = (input_ids < start) | (input_ids >= end)\n"
                "        local_ids = (input_ids - start).masked_fill(outside, 0)"))),
    Wrong("VocabParallelEmbedding", "the range tested on the shifted ids",
          expect="VocabParallelEmbedding.forward, rank",
          edit=(("        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)\n"
                "        local_ids = (input_ids - self.vocab_start_index).masked_fill(outside, 0)"),
                ("        shifted = input_ids - self.vocab_start_index\n"
                "        outside = (shifted < self.vocab_start_index) | (shifted >= self.vocab_end_index)\n"
                "        local_ids = shifted.masked_fill(outside, 0)"))),
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
    Wrong("QKVParallelLinear", "silently ignores an unknown shard_id", expect="must raise ValueError",
          source='''
class QKVParallelLinear(ReferenceQKVParallelLinear):
    def weight_loader(self, param, loaded_weight, shard_id=None):
        q_size, kv_size, _ = self.split_sizes
        where = {"q": (0, q_size), "k": (q_size, kv_size), "v": (q_size + kv_size, kv_size)}.get(shard_id)
        if where is None:
            return
        offset, size = where
        shard = self.tp_rank if shard_id == "q" else self.kv_partition.shard_rank
        with torch.no_grad():
            param.data.narrow(0, offset, size).copy_(loaded_weight.narrow(0, shard * size, size))
'''),
    Wrong("QKVParallelLinear", "an unknown shard_id fails with a KeyError from the table",
          expect="expected a ValueError",
          edit=(("        if shard_id not in (\"q\", \"k\", \"v\"):\n"
                "            raise ValueError(f\"shard_id must be one of 'q', 'k', 'v', got {shard_id!r}\")\n"), "")),
    Wrong("QKVParallelLinear", "v written over k (v's offset right after q)", expect="this rank's k block",
          edit=('"v": (q_size + kv_size, kv_size)', '"v": (q_size, kv_size)')),
    Wrong("QKVParallelLinear", "the KV shard taken as tp_rank modulo the number of shards", expect="replicated",
          edit=('shard = self.tp_rank if shard_id == "q" else self.kv_partition.shard_rank',
                'shard = self.tp_rank if shard_id == "q" else self.tp_rank % self.kv_partition.num_shards')),
    Wrong("QKVParallelLinear", "copies into the Parameter itself, with autograd on", expect="raised RuntimeError",
          edit=("        with torch.no_grad():\n            param.data.narrow(0, offset, size)",
                "        if True:\n            param.narrow(0, offset, size)")),
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
    Wrong("EngineCoreProc", "steps and emits when idle",
          expect="iteration 6: it put an EngineCoreOutputs with no outputs",
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
    Wrong("EngineCoreProc", "never waits: an idle core spins on the queue", expect="it spins", source='''
class EngineCoreProc(ReferenceEngineCoreProc):
    def _process_input_queue(self):
        while True:
            try:
                item = self.input_queue.get_nowait()
            except queue.Empty:
                return True
            if item is _SHUTDOWN:
                return False
            self._handle_client_request(*item)

    def _process_engine_step(self):
        if not self.engine_core.has_unfinished_requests():
            return
        outputs = self.engine_core.step()
        if outputs:
            self.output_queue.put(EngineCoreOutputs(outputs=outputs, scheduler_stats=self._scheduler_stats(),
                                                    timestamp=time.monotonic()))
'''),
    Wrong("EngineCoreProc", "emits an empty EngineCoreOutputs for a prefill chunk",
          expect="iteration 7: it put an EngineCoreOutputs with no outputs",
          edit=("        if outputs:\n            self.output_queue.put(",
                "        if outputs is not None:\n            self.output_queue.put(")),
    Wrong("EngineCoreProc", "keeps draining after the shutdown sentinel", expect="AFTER the shutdown sentinel",
          edit=("""        while True:
            try:
                item = self.input_queue.get_nowait()
            except queue.Empty:
                return True
            if item is _SHUTDOWN:
                return False
            self._handle_client_request(*item)""", """        stop = False
        while True:
            try:
                item = self.input_queue.get_nowait()
            except queue.Empty:
                return not stop
            if item is _SHUTDOWN:
                stop = True
                continue
            self._handle_client_request(*item)""")),
    Wrong("EngineCoreProc", "one EngineCoreOutputs per request", expect="part at step 'iteration 0'",
          edit=("""        if outputs:
            self.output_queue.put(EngineCoreOutputs(outputs=outputs, scheduler_stats=self._scheduler_stats(),
                                                    timestamp=time.monotonic()))""", """        for output in outputs:
            self.output_queue.put(EngineCoreOutputs(outputs=[output], scheduler_stats=self._scheduler_stats(),
                                                    timestamp=time.monotonic()))""")),
    Wrong("EngineCoreProc", "the drain's end returns None", expect="keep running",
          edit=("""            except queue.Empty:
                return True""", """            except queue.Empty:
                return""")),
    # ---- get_core_engine_for_request
    Wrong("get_core_engine_for_request", "ties always go to core 0", expect="FIRST core",
          edit=("index = (eng_start_index + offset) % num_engines", "index = offset")),
    Wrong("get_core_engine_for_request", "the last of equal scores wins", expect="strict <",
          edit=("if score < best_score:", "if score <= best_score:")),
    Wrong("get_core_engine_for_request", "ignores this client's in-flight requests", expect="client_count * inflight",
          edit=("score = max(client_count * engine_inflight[index], waiting + running)", "score = waiting + running")),
    Wrong("get_core_engine_for_request", "no KV-cache pressure penalty", expect="kv_cache_usage - 0.5",
          edit=("            score += waiting * 6.0 * max(0.0, kv_cache_usage - 0.5)", "            pass")),
    Wrong("get_core_engine_for_request", "a negative penalty below half usage", expect="kv_cache_usage - 0.5",
          edit=("max(0.0, kv_cache_usage - 0.5)", "(kv_cache_usage - 0.5)")),
    Wrong("get_core_engine_for_request", "bumps the chosen core's waiting count in the caller's list",
          expect="changed its inputs: lb_engines",
          edit=("    return best_index\n", "    lb_engines[best_index][0] += client_count\n    return best_index\n")),
    Wrong("get_core_engine_for_request", "reads a usage that a pair does not have", expect="raised IndexError",
          edit=("        kv_cache_usage = counts[2] if len(counts) > 2 else 0.0",
                "        kv_cache_usage = counts[2]")),
    Wrong("get_core_engine_for_request", "pads the caller's counts with a usage of 0", expect="changed its inputs",
          edit=("        kv_cache_usage = counts[2] if len(counts) > 2 else 0.0",
                "        if len(counts) < 3:\n            counts.append(0.0)\n        kv_cache_usage = counts[2]")),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("14_across_processes", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
