"""Phase 13's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

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
          edit=("text=old.text + completion.text", "text=completion.text"), expect="texts and token ids"),
    Wrong("merge_delta_outputs", "samples only in pending are dropped",
          edit=("by_index = {c.index: dataclasses.replace(c, token_ids=list(c.token_ids)) for c in pending.outputs}",
                "by_index = {}"), expect="a sample only in one of them is kept"),
    Wrong("merge_delta_outputs", "finish_reason kept from pending",
          edit=("by_index[completion.index] = dataclasses.replace(\n            completion,",
                "by_index[completion.index] = dataclasses.replace(\n            old,"),
          expect="finish_reason"),
    Wrong("merge_delta_outputs", "merges in place into pending", source=MERGE_IN_PLACE,
          expect="do not change pending's or new's"),
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
          edit=("blocks_per_request = -(-max_model_len // block_size)", "blocks_per_request = max_model_len // block_size"),
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
