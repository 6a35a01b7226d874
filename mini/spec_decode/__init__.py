"""Mirrors vllm/v1/spec_decode/: the proposers that draft tokens for speculative decoding."""
