"""Plausible wrong answers to phase 06 (the engine loop and I/O): each must fail its check, saying where."""

from __future__ import annotations

import pytest
from course_fidelity import Wrong, assert_wrong_fails, wrong_params

WRONG = [
    # detokenize_incrementally
    Wrong("detokenize_incrementally", "emits text ending in an unfinished character",
          edit=("len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR)",
                "len(new_text) <= len(prefix_text)"),
          expect="detokenize_incrementally"),
    Wrong("detokenize_incrementally", "keeps the old prefix offset",
          edit=("return new_text[len(prefix_text):], read_offset, len(tokens)",
                "return new_text[len(prefix_text):], prefix_offset, len(tokens)"),
          expect="detokenize_incrementally"),
    Wrong("detokenize_incrementally", "decodes the new token alone",
          source='''
          def detokenize_incrementally(tokenizer, tokens, prefix_offset, read_offset):
              new_text = tokenizer.convert_tokens_to_string(tokens[read_offset:])
              if not new_text or new_text.endswith(REPLACEMENT_CHAR):
                  return "", prefix_offset, read_offset
              return new_text, read_offset, len(tokens)
          ''', expect="leading space"),
    # check_stop_strings: any rule other than vLLM's (earliest end, then list order)
    Wrong("check_stop_strings", "smallest start wins",
          edit=("index + len(stop_str) < best[0]):\n            best = (index + len(stop_str), index, stop_str)",
                "index < best[1]):\n            best = (index + len(stop_str), index, stop_str)"),
          expect="ENDS earliest"),
    Wrong("check_stop_strings", "last in the list wins a tie",
          edit=("index + len(stop_str) < best[0]):", "index + len(stop_str) <= best[0]):"),
          expect="listed first"),
    Wrong("check_stop_strings", "no tie-break: the longest stop string wins a tie",
          source='''
          def check_stop_strings(output_text, new_char_count, stop, include_in_output):
              if not new_char_count or not stop:
                  return None
              matches = []
              for stop_str in stop:
                  start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)
                  index = output_text.find(stop_str, start)
                  if index != -1:
                      matches.append((index + len(stop_str), -len(stop_str), index, stop_str))
              if not matches:
                  return None
              end, _, index, stop_str = min(matches)
              if not include_in_output:
                  return stop_str, index
              return stop_str, (-1 if end >= len(output_text) else end)
          ''', expect="listed first"),
    Wrong("check_stop_strings", "first stop string of the list that matches wins",
          source='''
          def check_stop_strings(output_text, new_char_count, stop, include_in_output):
              if not new_char_count or not stop:
                  return None
              for stop_str in stop:
                  start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)
                  index = output_text.find(stop_str, start)
                  if index != -1:
                      end = index + len(stop_str)
                      if not include_in_output:
                          return stop_str, index
                      return stop_str, (-1 if end >= len(output_text) else end)
              return None
          ''', expect="ENDS earliest"),
    Wrong("check_stop_strings", "searches only the new text (misses a straddling stop string)",
          edit=("start = max(len(output_text) - new_char_count - len(stop_str) + 1, 0)",
                "start = len(output_text) - new_char_count"),
          expect="straddle"),
    Wrong("check_stop_strings", "never returns -1 for an included stop string at the very end",
          edit=("return stop_str, (-1 if end >= len(output_text) else end)", "return stop_str, end"),
          expect="-1 if that is the very end"),
    # check_stop
    Wrong("check_stop", "min_tokens checked before EOS (older vLLM order)",
          source='''
          def check_stop(request, max_model_len):
              params = request.sampling_params
              if request.num_output_tokens >= (params.min_tokens or 0):
                  last_token_id = request.output_token_ids[-1]
                  if not params.ignore_eos and last_token_id == request.eos_token_id:
                      request.status = RequestStatus.FINISHED_STOPPED
                      return True
                  if last_token_id in (params.stop_token_ids or ()):
                      request.status = RequestStatus.FINISHED_STOPPED
                      request.stop_reason = last_token_id
                      return True
              if request.num_tokens >= max_model_len or (
                      request.max_tokens is not None and request.num_output_tokens >= request.max_tokens):
                  request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                  return True
              return False
          ''', expect="min_tokens plays no part"),
    Wrong("check_stop", "length limits checked before EOS",
          source='''
          def check_stop(request, max_model_len):
              params = request.sampling_params
              last_token_id = request.output_token_ids[-1]
              if request.num_tokens >= max_model_len or (
                      request.max_tokens is not None and request.num_output_tokens >= request.max_tokens):
                  request.status = RequestStatus.FINISHED_LENGTH_CAPPED
                  return True
              if not params.ignore_eos and last_token_id == request.eos_token_id:
                  request.status = RequestStatus.FINISHED_STOPPED
                  return True
              if last_token_id in (params.stop_token_ids or ()):
                  request.status = RequestStatus.FINISHED_STOPPED
                  request.stop_reason = last_token_id
                  return True
              return False
          ''', expect="only then num_tokens >= max_model_len"),
    Wrong("check_stop", "no stop_reason for a stop token id",
          edit=("        request.stop_reason = last_token_id\n", ""), expect="stop_reason"),
    Wrong("check_stop", "ignore_eos also ignores the stop token ids",
          edit=("    if last_token_id in (params.stop_token_ids or ()):",
                "    if not params.ignore_eos and last_token_id in (params.stop_token_ids or ()):"),
          expect="check_stop"),
    # step
    Wrong("step", "never finishes requests stopped by a stop string in the scheduler",
          edit=("        self.scheduler.finish_requests(stopped_by_string, RequestStatus.FINISHED_STOPPED)\n",
                "        pass\n"),
          expect="finish_requests"),
    Wrong("step", "drops the outputs left pending by abort_request",
          edit=("    return outputs + request_outputs", "    return request_outputs"),
          expect="step"),
    Wrong("step", "pending outputs after the new ones",
          edit=("    return outputs + request_outputs", "    return request_outputs + outputs"),
          expect="step"),
    # ParentRequest: the n > 1 fan-out and gather
    Wrong("ParentRequest", "child id spelled parent_index",
          edit=('child_id = f"{index}_{self.request_id}"', 'child_id = f"{self.request_id}_{index}"'),
          expect="child 0: its request id"),
    Wrong("ParentRequest", "every child gets the parent's seed",
          edit=("        if params.seed is not None:\n            params.seed += index\n", ""),
          expect="SamplingParams.seed"),
    Wrong("ParentRequest", "changes the parent's params instead of a copy",
          edit=("params = self.sampling_params.clone()", "params = self.sampling_params"),
          expect="the parent's own SamplingParams after get_child_info(0)"),
    Wrong("ParentRequest", "the parent finishes when any child finishes",
          edit=("finished = not self.child_requests", "finished = completion_output.finished()"),
          expect="LAST child"),
    Wrong("ParentRequest", "DELTA repeats a child that had already finished",
          edit=("return ([] if late_duplicate else [completion_output]), finished",
                "return [completion_output], finished"),
          expect="already finished"),
    Wrong("ParentRequest", "FINAL_ONLY shows outputs before the last child finishes",
          edit=("return ([] if not finished else list(self.output_aggregator)), finished",
                ("return ([] if not completion_output.finished() else [o for o in self.output_aggregator if o]), "
                 "finished")),
          expect="FINAL_ONLY: show nothing until the LAST child finishes"),
    Wrong("ParentRequest", "CUMULATIVE shows every child heard from (mini's rule until 2026-11-27, not vLLM's)",
          source='''
          class ParentRequest:
              def __init__(self, request):
                  self.request_id = request.request_id
                  self.sampling_params = request.sampling_params
                  self.child_requests = set()
                  self.latest_outputs = [None] * self.sampling_params.n

              @property
              def n(self):
                  return self.sampling_params.n

              def get_child_info(self, index):
                  child_id = f"{index}_{self.request_id}"
                  self.child_requests.add(child_id)
                  params = self.sampling_params.clone()
                  params.n = 1
                  if params.seed is not None:
                      params.seed += index
                  return child_id, params

              def get_outputs(self, child_request_id, completion_output):
                  late_duplicate = False
                  if completion_output.finished():
                      if child_request_id in self.child_requests:
                          self.child_requests.remove(child_request_id)
                      else:
                          late_duplicate = True
                  self.latest_outputs[completion_output.index] = completion_output
                  finished = not self.child_requests
                  kind = self.sampling_params.output_kind
                  if kind == RequestOutputKind.DELTA:
                      return ([] if late_duplicate else [completion_output]), finished
                  if kind == RequestOutputKind.FINAL_ONLY and not finished:
                      return [], finished
                  return [output for output in self.latest_outputs if output is not None], finished
          ''', expect="CUMULATIVE: like DELTA"),
    # beam_search_step
    Wrong("beam_search_step", "sorts ascending and reverses (ties come out reversed)",
          edit=("instance.beams = sorted(candidates, key=score, reverse=True)[:beam_width]",
                "instance.beams = sorted(candidates, key=score)[::-1][:beam_width]"),
          expect="ties"),
    Wrong("beam_search_step", "divides by the whole length, prompt included (older vLLM)",
          edit=("max(len(beam.logprobs), 1)", "len(beam.tokens)"),
          expect="NOT the prompt"),
    Wrong("beam_search_step", "ranks by cum_logprob alone (no length penalty)",
          edit=("return beam.cum_logprob / (max(len(beam.logprobs), 1) ** length_penalty)",
                "return beam.cum_logprob"),
          expect="length_penalty"),
    Wrong("beam_search_step", "keeps EOS candidates live",
          edit=(("            if token_id == eos_token_id:\n                instance.completed.append(candidate)\n"
                 "            else:\n                candidates.append(candidate)"),
                "            candidates.append(candidate)"),
          expect="never stays live"),
    Wrong("beam_search_step", "expands each beam by its top beam_width tokens only",
          edit=("for token_id, logprob in (logprobs or {}).items():",
                "for token_id, logprob in list((logprobs or {}).items())[:beam_width]:"),
          expect="token of its logprobs dict"),
    Wrong("beam_search_step", "records only the chosen token's logprob",
          edit=("logprobs=beam.logprobs + [logprobs],", "logprobs=beam.logprobs + [{token_id: logprob}],"),
          expect="WHOLE logprobs dict"),
    Wrong("beam_search_step", "extends the parent beam in place",
          source='''
          def beam_search_step(instance, beam_logprobs, beam_width, length_penalty, eos_token_id):
              candidates = []
              for beam, logprobs in zip(instance.beams, beam_logprobs):
                  for token_id, logprob in (logprobs or {}).items():
                      tokens = beam.tokens
                      tokens.append(token_id)
                      candidate = BeamSearchSequence(orig_prompt=beam.orig_prompt, tokens=tokens,
                                                     logprobs=beam.logprobs + [logprobs],
                                                     cum_logprob=beam.cum_logprob + logprob.logprob)
                      (instance.completed if token_id == eos_token_id else candidates).append(candidate)
              key = lambda b: b.cum_logprob / max(len(b.logprobs), 1) ** length_penalty
              instance.beams = sorted(candidates, key=key, reverse=True)[:beam_width]
          ''', expect="beam_search_step: instance."),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("06_engine_loop", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
