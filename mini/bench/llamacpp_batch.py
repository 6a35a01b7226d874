"""llama.cpp over a batch of sequences, greedy, through llama-cpp-python's low-level API.

Mirrors no vLLM file. It is the peer of mini/bench/llamacpp.py. llama-cpp-python's `Llama.generate` runs one
sequence at a time. llama.cpp itself decodes many sequences in one batch: its `batched` example does, and so do
its server's parallel slots. This module does the same through the C API that llama-cpp-python binds:
- one context holds `n_seq_max` sequences, each in its own part of the KV cache (`kv_unified=False`: a sequence
  attends only to its own cells);
- the prompts are prefilled together, in `llama_decode` calls of at most `n_batch` tokens;
- then each decode call carries one token for every request still running, and reads that row's logits.
A request ends when it has its output length: EOS is ignored, as in mini's benchmark. This is mini's schedule
when every request fits the batch at once (`max_num_seqs` >= the number of requests). The greedy pick is numpy's
argmax, the first index on ties, as mini's.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mini.bench.workload import Workload


class BatchedLlamaCpp:
    """A llama.cpp context for `num_sequences` sequences of up to `max_len` tokens each, built on `llama`'s model."""

    def __init__(self, llama: Any, num_sequences: int, max_len: int, n_batch: int = 512) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self.llama_cpp = llama_cpp
        params = llama_cpp.llama_context_default_params()
        params.n_seq_max = num_sequences
        params.kv_unified = False
        per_sequence = -(-max_len // 256) * 256        # llama.cpp pads each sequence's cells to 256
        params.n_ctx = per_sequence * num_sequences
        params.n_batch = params.n_ubatch = n_batch
        params.n_threads = params.n_threads_batch = llama.context_params.n_threads
        self.context = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        self.n_batch = n_batch
        self.n_vocab = llama._model.n_vocab()
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)

    def close(self) -> None:
        if self.batch is not None:
            self.llama_cpp.llama_batch_free(self.batch)
            self.batch = None
        self.context.close()

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One `llama_decode` of (token, position, sequence, wants logits) entries."""
        batch = self.batch
        for index, (token, position, sequence, logits) in enumerate(entries):
            batch.token[index] = token
            batch.pos[index] = position
            batch.n_seq_id[index] = 1
            batch.seq_id[index][0] = sequence
            batch.logits[index] = logits
        batch.n_tokens = len(entries)
        status = self.llama_cpp.llama_decode(self.context.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode returned {status} for a batch of {len(entries)} tokens")

    def _greedy(self, index: int) -> int:
        row = self.llama_cpp.llama_get_logits_ith(self.context.ctx, index)
        return int(np.ctypeslib.as_array(row, shape=(self.n_vocab,)).argmax())

    def generate(self, workload: Workload) -> tuple[float, list[list[int]]]:
        """Greedy tokens of every request, exactly `output_lens` each: (seconds, token ids)."""
        self.llama_cpp.llama_memory_clear(self.context.memory, True)
        outputs: list[list[int]] = [[] for _ in workload.prompts]
        start = time.perf_counter()
        # Prefill, n_batch tokens a call; a prompt's last token asks for logits (its first output token).
        pending: list[tuple[int, int, int, bool]] = []
        last_of: dict[int, int] = {}
        for sequence, prompt in enumerate(workload.prompts):
            for position, token in enumerate(prompt):
                is_last = position == len(prompt) - 1
                if is_last:
                    last_of[sequence] = len(pending)
                pending.append((token, position, sequence, is_last))
                if len(pending) == self.n_batch:
                    self._prefill(pending, last_of, outputs)
                    pending, last_of = [], {}
        if pending:
            self._prefill(pending, last_of, outputs)
        # Decode: one token for each request that still needs some.
        while True:
            running = [s for s, out in enumerate(outputs) if len(out) < workload.output_lens[s]]
            if not running:
                break
            self._decode([(outputs[s][-1], len(workload.prompts[s]) + len(outputs[s]) - 1, s, True)
                          for s in running])
            for index, sequence in enumerate(running):
                outputs[sequence].append(self._greedy(index))
        return time.perf_counter() - start, outputs

    def _prefill(self, entries: list[tuple[int, int, int, bool]], last_of: dict[int, int],
                 outputs: list[list[int]]) -> None:
        self._decode(entries)
        for sequence, index in last_of.items():
            outputs[sequence].append(self._greedy(index))


__all__ = ["BatchedLlamaCpp"]
