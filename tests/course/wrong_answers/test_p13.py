"""Phase 13's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

MERGE_IN_PLACE = '''
def merge_delta_outputs(pending, new):
    by_index = {c.index: c for c in pending.outputs}
    for completion in new.outputs:
        old = by_index.get(completion.index)
        if old is None:
            pending.outputs.append(completion)
            continue
        old.text += completion.text
        old.token_ids.extend(completion.token_ids)
        if completion.logprobs is not None:
            old.logprobs = (old.logprobs or []) + list(completion.logprobs)
        old.finish_reason, old.stop_reason = completion.finish_reason, completion.stop_reason
        old.cumulative_logprob = completion.cumulative_logprob
    pending.finished = new.finished
    return pending
'''

MERGE_EXTENDS_PENDING_LISTS = '''
def merge_delta_outputs(pending, new):
    by_index = {c.index: c for c in pending.outputs}
    for completion in new.outputs:
        old = by_index.get(completion.index)
        if old is None:
            by_index[completion.index] = completion
            continue
        old.token_ids.extend(completion.token_ids)
        logprobs = old.logprobs
        if completion.logprobs is not None:
            logprobs = (logprobs or []) + list(completion.logprobs)
        by_index[completion.index] = dataclasses.replace(
            completion, text=old.text + completion.text, token_ids=old.token_ids, logprobs=logprobs)
    prompt_logprobs = pending.prompt_logprobs if pending.prompt_logprobs is not None else new.prompt_logprobs
    return dataclasses.replace(new, outputs=list(by_index.values()), prompt_logprobs=prompt_logprobs)
'''

HANDLER_PULLS_TWICE = '''
async def output_handler_step(engine_core, output_processor, collectors):
    for _ in range(2):   # drain what is there
        request_outputs, reqs_to_abort = output_processor.process_outputs(await engine_core.get_output_async())
        for output in request_outputs:
            collector = collectors.pop(output.request_id) if output.finished else collectors.get(output.request_id)
            if collector is not None:
                collector.put(output)
        if reqs_to_abort:
            await engine_core.abort_requests_async(reqs_to_abort)
'''

HANDLER_ABORTS_EVERY_FINISHED = '''
async def output_handler_step(engine_core, output_processor, collectors):
    request_outputs, _ = output_processor.process_outputs(await engine_core.get_output_async())
    finished = []
    for output in request_outputs:
        collector = collectors.pop(output.request_id) if output.finished else collectors.get(output.request_id)
        collector.put(output)
        if output.finished:
            finished.append(output.request_id)
    if finished:
        await engine_core.abort_requests_async(finished)
'''

HANDLER_PUSHES_CORE_OUTPUTS = '''
async def output_handler_step(engine_core, output_processor, collectors):
    engine_core_outputs = await engine_core.get_output_async()
    _, reqs_to_abort = output_processor.process_outputs(engine_core_outputs)
    for output in engine_core_outputs:
        collector = collectors.pop(output.request_id) if output.finished else collectors.get(output.request_id)
        if collector is not None:
            collector.put(output)
    if reqs_to_abort:
        await engine_core.abort_requests_async(reqs_to_abort)
'''

GENERATE_ABORTS_IN_FINALLY = '''
async def generate_stream(engine_core, output_processor, collectors, request):
    request_id = request.request_id
    collector = RequestOutputCollector(request.sampling_params.output_kind, asyncio.get_running_loop())
    collectors[request_id] = collector
    output_processor.add_request(request)
    await engine_core.add_request_async(request)
    try:
        while True:
            output = await collector.get()
            yield output
            if output.finished:
                return
    finally:
        collectors.pop(request_id, None)
        output_processor.abort_requests([request_id])
        await engine_core.abort_requests_async([request_id])
'''

WRONG = [
    # merge_delta_outputs
    Wrong("merge_delta_outputs", "new text replaces the unread text",
          edit=("text=old.text + completion.text", "text=completion.text"), expect="the new text is appended"),
    Wrong("merge_delta_outputs", "samples only in pending are dropped",
          edit=("by_index = {c.index: dataclasses.replace(c, token_ids=list(c.token_ids)) for c in pending.outputs}",
                "by_index = {}"), expect="the unread text comes first"),
    Wrong("merge_delta_outputs", "finish_reason kept from pending",
          edit=("by_index[completion.index] = dataclasses.replace(\n            completion,",
                "by_index[completion.index] = dataclasses.replace(\n            old,"),
          expect="finish_reason"),
    Wrong("merge_delta_outputs", "merges in place into pending", source=MERGE_IN_PLACE,
          expect="do not change pending's or new's"),
    Wrong("merge_delta_outputs", "prompt_logprobs taken from the newer output (DELTA folding loses them)",
          edit=("prompt_logprobs=prompt_logprobs)", "prompt_logprobs=new.prompt_logprobs)"),
          expect="prompt logprobs come once, with its first output"),
    Wrong("merge_delta_outputs", "logprobs become [] when none were asked for",
          edit=(("logprobs = old.logprobs\n        if completion.logprobs is not None:\n"
                 "            logprobs = (logprobs or []) + list(completion.logprobs)"),
                "logprobs = (old.logprobs or []) + list(completion.logprobs or [])"),
          expect="they stay None, not []"),
    Wrong("merge_delta_outputs", "cumulative_logprob added up",
          edit=("            logprobs=logprobs)",
                ("            logprobs=logprobs, cumulative_logprob=(old.cumulative_logprob or 0.0)"
                 " + (completion.cumulative_logprob or 0.0))")),
          expect="counts the earlier tokens twice"),
    Wrong("merge_delta_outputs", "extends pending's token list in place", source=MERGE_EXTENDS_PENDING_LISTS,
          expect="do not change pending's"),
    # output_handler_step
    Wrong("output_handler_step", "stop-string requests never aborted in the engine core",
          edit=("    if reqs_to_abort:\n        await engine_core.abort_requests_async(reqs_to_abort)\n", "    pass\n"),
          expect="the requests the engine core was told to abort"),
    Wrong("output_handler_step", "every finished request aborted", source=HANDLER_ABORTS_EVERY_FINISHED,
          expect="abort nothing else"),
    Wrong("output_handler_step", "finished requests keep their collectors",
          edit=("collectors.pop(output.request_id) if output.finished else collectors.get(output.request_id)",
                "collectors.get(output.request_id)"), expect="the request ids left in `collectors`"),
    Wrong("output_handler_step", "raw EngineCoreOutputs pushed to the collectors", source=HANDLER_PUSHES_CORE_OUTPUTS,
          expect="the output in its collector"),
    Wrong("output_handler_step", "every output's collector popped, finished or not",
          edit=("collectors.pop(output.request_id) if output.finished else collectors.get(output.request_id)",
                "collectors.pop(output.request_id, None)"), expect="an unfinished request keeps its collector"),
    Wrong("output_handler_step", "the core pulled twice in one turn", source=HANDLER_PULLS_TWICE,
          expect="pulls the engine core's outputs exactly once"),
    # generate_stream
    Wrong("generate_stream", "GeneratorExit not handled (a closed stream is not aborted)",
          edit=("except (asyncio.CancelledError, GeneratorExit):", "except asyncio.CancelledError:"),
          expect="the aborts the engine core received"),
    Wrong("generate_stream", "aborted in the engine core only",
          edit=("        output_processor.abort_requests([request_id])\n", ""),
          expect="requests left in the output processor"),
    Wrong("generate_stream", "the cancellation swallowed",
          edit=("        await engine_core.abort_requests_async([request_id])\n        raise",
                "        await engine_core.abort_requests_async([request_id])"),
          expect="ended cancelled"),
    Wrong("generate_stream", "aborts in `finally`, also after a normal finish", source=GENERATE_ABORTS_IN_FINALLY,
          expect="needs no abort"),
    Wrong("generate_stream", "never added to the engine core",
          edit=("    await engine_core.add_request_async(request)\n", ""),
          expect="requests added to the engine core"),
    Wrong("generate_stream", "the core's abort never awaited (the coroutine is dropped)",
          edit=("        await engine_core.abort_requests_async([request_id])\n        raise",
                "        engine_core.abort_requests_async([request_id])\n        raise"),
          expect="never reached the engine core as an abort"),
    Wrong("generate_stream", "the collector kept after the consumer left",
          edit=("        collectors.pop(request_id, None)\n", ""),
          expect="gives up its collector"),
    # determine_num_gpu_blocks
    Wrong("determine_num_gpu_blocks", "peak activations not subtracted",
          edit=("profile.weights_bytes + profile.peak_activation_bytes + profile.non_torch_bytes",
                "profile.weights_bytes + profile.non_torch_bytes"),
          expect="the peak activations of the profiling run were not subtracted"),
    Wrong("determine_num_gpu_blocks", "the null block added on top",
          edit=("    return num_blocks\n", "    return num_blocks + 1\n"), expect="the null block was added on top"),
    Wrong("determine_num_gpu_blocks", "the null block counted as usable in the fit check",
          edit=("if num_blocks - 1 < blocks_per_request:", "if num_blocks < blocks_per_request:"),
          expect="never handed out"),
    Wrong("determine_num_gpu_blocks", "a partial block of max_model_len not counted",
          edit=("blocks_per_request = -(-max_model_len // block_size)",
                "blocks_per_request = max_model_len // block_size"),
          expect="a partial block counting as a whole one"),
    Wrong("determine_num_gpu_blocks", "requested memory rounded down",
          edit=("math.ceil(profile.total_bytes * gpu_memory_utilization)",
                "int(profile.total_bytes * gpu_memory_utilization)"), expect="ceil("),
    Wrong("determine_num_gpu_blocks", "utilization applied after subtracting",
          edit=(("    requested = math.ceil(profile.total_bytes * gpu_memory_utilization)\n"
                 "    non_kv = profile.weights_bytes + profile.peak_activation_bytes + profile.non_torch_bytes\n"
                 "    available = requested - non_kv\n"),
                ("    non_kv = profile.weights_bytes + profile.peak_activation_bytes + profile.non_torch_bytes\n"
                 "    available = math.floor((profile.total_bytes - non_kv) * gpu_memory_utilization)\n")),
          expect="applied after subtracting"),
]


@pytest.fixture(scope="module", autouse=True)
def _tokenizer_loaded_once():
    """The asyncio checks detokenize with the shipped tokenizer; each graded check runs in a child forked from
    this process, so loading it here once spares every child the import of transformers."""
    from labs.checks.p13 import _tokenizer, _word_tokens

    _tokenizer()
    _word_tokens()


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("13_serving", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)


def test_plug_serving_passes_mini_pieces_and_names_what_a_wrong_handler_changed():
    """"Plug it in": mini's handler and generator serve the shipped model; a handler that never aborts
    stop-string requests fails with the aborts (expected vs got), not a bare assert."""
    from labs.checks.p13 import plug_serving
    from mini.engine.async_llm import generate_stream, output_handler_step

    served = plug_serving(output_handler_step, generate_stream)
    assert sorted(served["aborted"]) == ["plug-0", "plug-2"]
    assert served["free_blocks"][0] == served["free_blocks"][1]

    async def no_stop_string_abort(engine_core, output_processor, collectors):
        request_outputs, _ = output_processor.process_outputs(await engine_core.get_output_async())
        for output in request_outputs:
            collector = collectors.pop(output.request_id) if output.finished else collectors.get(output.request_id)
            collector.put(output)

    with pytest.raises(AssertionError) as failure:
        plug_serving(no_stop_string_abort, generate_stream)
    message = str(failure.value)
    assert "the aborts the engine core received" in message and "expected" in message and "got" in message, message
