"""Engine statistics (mirrors vllm/v1/metrics/)."""
