"""The OpenAI-compatible server (mirrors vllm/entrypoints/openai/ and vllm/entrypoints/launchers/): api_server,
protocol, serving_*."""
