"""Mirrors vllm/v1/engine/__init__.py: the engine package (input processing, output processing, engine loop).

Kept import-light on purpose: import the modules you need (`mini.engine.input_processor`, ...) directly.
`EngineCoreRequest` lives in `mini/engine/core_request.py` (vLLM defines it in this __init__).
"""
