"""Mirrors vllm/v1/core/: paged KV memory (blocks, pool, manager), requests and the scheduler."""
