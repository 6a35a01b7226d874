"""The OpenAI-compatible server (mirrors vllm/entrypoints/openai/): api_server, protocol, serving_*."""
