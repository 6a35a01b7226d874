"""Plausible wrong answers to phase 06 (the engine loop and I/O): each must fail its check, saying where.

`check_stop` follows vLLM v0.33.0 (vllm/v1/core/sched/utils.py): EOS is `sampling_params.eos_token_id` (None under
ignore_eos), then stop token ids, then the length limits; `min_tokens` gates none of them (it gates only vLLM's
repetition detection, which mini does not have).
"""

from __future__ import annotations

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

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
    Wrong("detokenize_incrementally", "re-decodes the whole output at every call (right text, quadratic work)",
          edit=(("tokenizer.convert_tokens_to_string(tokens[prefix_offset:read_offset])\n"
                 "    new_text = tokenizer.convert_tokens_to_string(tokens[prefix_offset:])"),
                ("tokenizer.convert_tokens_to_string(tokens[:read_offset])\n"
                 "    new_text = tokenizer.convert_tokens_to_string(tokens)")),
          expect="the most tokens one decode call was given"),
    Wrong("detokenize_incrementally", "moves the read offset by one token, not past every unread token",
          edit=("return new_text[len(prefix_text):], read_offset, len(tokens)",
                "return new_text[len(prefix_text):], read_offset, read_offset + 1"),
          expect="(text, read_offset, len(tokens))"),
    Wrong("detokenize_incrementally", "advances the offsets while the text waits for a whole character",
          edit=('        return "", prefix_offset, read_offset', '        return "", read_offset, len(tokens)'),
          expect="return '' and the SAME offsets"),
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
          expect="a stop_token_ids token (even under ignore_eos)"),
    Wrong("check_stop", "EOS compared with the tokenizer's id, ignore_eos forgotten",
          edit=("    if last_token_id == params.eos_token_id:", "    if last_token_id == request.eos_token_id:"),
          expect="None under ignore_eos"),
    Wrong("check_stop", "stop_reason set for EOS too",
          edit=("        request.status = RequestStatus.FINISHED_STOPPED\n        return True\n    if last_token_id in",
                ("        request.status = RequestStatus.FINISHED_STOPPED\n        request.stop_reason = last_token_id\n"
                 "        return True\n    if last_token_id in")),
          expect="check_stop: request.stop_reason afterwards"),
    Wrong("check_stop", "max_model_len reached one token late",
          edit=("if request.num_tokens >= max_model_len or (", "if request.num_tokens > max_model_len or ("),
          expect="only then num_tokens >= max_model_len"),
    Wrong("check_stop", "max_tokens=None read as no output allowed",
          edit=("request.max_tokens is not None and request.num_output_tokens >= request.max_tokens",
                "request.num_output_tokens >= (request.max_tokens or 0)"),
          expect="(None: no limit)"),
    # step
    Wrong("step", "never finishes requests stopped by a stop string in the scheduler",
          edit=("        self.scheduler.finish_requests(stopped_by_string, RequestStatus.FINISHED_STOPPED)\n",
                "        pass\n"),
          expect="must be finished in the scheduler in the same iteration (finish_requests"),
    Wrong("step", "drops the outputs left pending by abort_request",
          edit=("    return outputs + request_outputs", "    return request_outputs"),
          expect="abort_request leaves the aborted request's final output in self._pending_outputs"),
    Wrong("step", "pending outputs after the new ones",
          edit=("    return outputs + request_outputs", "    return request_outputs + outputs"),
          expect="the outputs left pending by abort_request come first"),
    Wrong("step", "runs a forward pass with nothing scheduled",
          edit=("    if not self.scheduler.has_unfinished_requests():\n        return outputs\n", ""),
          expect="runs no forward pass"),
    Wrong("step", "pending outputs returned but never cleared",
          edit=("    outputs, self._pending_outputs = self._pending_outputs, []",
                "    outputs = list(self._pending_outputs)"),
          expect="returned by one iteration, then gone"),
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
    Wrong("ParentRequest", "FINAL_ONLY shows the samples in the order their children finished",
          edit=("        self.output_aggregator[completion_output.index] = completion_output\n",
                ("        self.output_aggregator = [o for o in self.output_aggregator if o is not None and "
                 "o.index != completion_output.index] + [completion_output]\n")),
          expect="then all n outputs in index order"),
    Wrong("ParentRequest", "n counts the children not finished yet",
          edit=("        return self.sampling_params.n\n", "        return len(self.child_requests)\n"),
          expect="ParentRequest.n right after ParentRequest(request)"),
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
    Wrong("beam_search_step", "instance.completed re-sorted by score",
          edit=("    instance.beams = sorted(candidates, key=score, reverse=True)[:beam_width]",
                ("    instance.beams = sorted(candidates, key=score, reverse=True)[:beam_width]\n"
                 "    instance.completed.sort(key=score, reverse=True)")),
          expect="appended to instance.completed (after the ones already there, in candidate order)"),
    Wrong("beam_search_step", "keeps the best beam_width candidates first, then moves the EOS ones out",
          source='''
          def beam_search_step(instance, beam_logprobs, beam_width, length_penalty, eos_token_id):
              def score(beam):
                  return beam.cum_logprob / (max(len(beam.logprobs), 1) ** length_penalty)
              candidates = []
              for beam, logprobs in zip(instance.beams, beam_logprobs):
                  for token_id, logprob in (logprobs or {}).items():
                      candidates.append(BeamSearchSequence(
                          orig_prompt=beam.orig_prompt, tokens=beam.tokens + [token_id],
                          logprobs=beam.logprobs + [logprobs], cum_logprob=beam.cum_logprob + logprob.logprob))
              best = sorted(candidates, key=score, reverse=True)[:beam_width]
              instance.completed += [c for c in best if c.tokens[-1] == eos_token_id]
              instance.beams = [c for c in best if c.tokens[-1] != eos_token_id]
          ''', expect="one that ends in eos_token_id is appended to instance.completed"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("06_engine_loop", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
