"""A deeply nested JSON schema is refused with a ValueError naming the nesting limit (vLLM v0.33.0:
`check_json_nesting` in vllm/sampling_params.py, MAX_STRUCTURED_OUTPUT_JSON_NESTING = 64), by the engine
at add_request and by the OpenAI server with a 400, never a RecursionError (a 500)."""

from __future__ import annotations

import pytest
from patience import HANG_GUARD_S

from mini.sampling_params import SamplingParams, StructuredOutputsParams
from mini.structured_output import validate_structured_outputs
from mini.structured_output.json_schema import MAX_STRUCTURED_OUTPUT_JSON_NESTING, check_json_nesting

# Run again with the engine core in-process by scripts/test.sh (`-m engine_modes`): both modes are tested.
pytestmark = pytest.mark.engine_modes


def nested_schema_text(levels: int) -> str:
    """An object schema nested `levels` objects deep, as JSON text (json.dumps itself would recurse)."""
    return '{"type": "object", "properties": {"a": ' * levels + '{"type": "string"}' + "}}" * levels


def nested_schema(levels: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("schema", [nested_schema(3000), nested_schema_text(3000), nested_schema(400),
                                    nested_schema_text(400), nested_schema(33)])
def test_deep_schema_is_a_value_error_naming_the_limit(schema):
    with pytest.raises(ValueError, match=f"nested too deeply.*at most {MAX_STRUCTURED_OUTPUT_JSON_NESTING}"):
        validate_structured_outputs(StructuredOutputsParams(json=schema))


def test_the_limit_counts_objects_and_arrays_as_vllm():
    # each object level of a schema is two JSON containers (the schema, its "properties"): 32 fit in 64
    check_json_nesting(nested_schema(31))
    validate_structured_outputs(StructuredOutputsParams(json=nested_schema(31)))
    with pytest.raises(ValueError, match="nested too deeply"):
        check_json_nesting(nested_schema(32))


def test_exploding_arrays_and_deep_regex_groups_are_value_errors():
    schema: dict = {"type": "string"}
    for _ in range(18):  # the regex of an array of arrays doubles per level
        schema = {"type": "array", "items": schema}
    with pytest.raises(ValueError, match="MAX_REGEX_LENGTH"):
        validate_structured_outputs(StructuredOutputsParams(json=schema))
    with pytest.raises(ValueError, match="nested more than"):
        validate_structured_outputs(StructuredOutputsParams(regex="(" * 3000 + "a" + ")" * 3000))


def test_engine_refuses_at_add_request():
    from mini import LLM

    llm = LLM()
    params = SamplingParams(max_tokens=4, structured_outputs=StructuredOutputsParams(json=nested_schema(400)))
    with pytest.raises(ValueError, match="nested too deeply"):
        llm.generate("x", params, use_tqdm=False)
    assert not llm.llm_engine.has_unfinished_requests()


def test_server_answers_400_naming_the_limit():
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from mini.engine.async_llm import AsyncLLM
    from mini.entrypoints.openai.api_server import build_app, serve_in_thread

    engine = AsyncLLM.from_engine_args(max_num_seqs=4)
    # 300 object levels: a body the JSON parser still reads, a schema far past the limit
    schema = nested_schema_text(300)
    bodies = {
        "/v1/completions": '{"model": "tiny-llama", "prompt": "x", "max_tokens": 4, '
                           '"structured_outputs": {"json": ' + schema + "}}",
        "/v1/chat/completions": '{"model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], '
                                '"max_tokens": 4, "response_format": {"type": "json_schema", '
                                '"json_schema": {"name": "deep", "schema": ' + schema + "}}}",
    }
    with serve_in_thread(build_app(engine, "tiny-llama")) as url:
        for path, body in bodies.items():
            response = httpx.post(f"{url}{path}", content=body, headers={"content-type": "application/json"},
                                  timeout=HANG_GUARD_S)
            assert response.status_code == 400, (path, response.text[:300])
            assert "nested too deeply" in response.json()["error"]["message"]
