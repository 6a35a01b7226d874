"""Mirrors vllm/v1/core/sched/: the scheduler, its output and its waiting queues."""
