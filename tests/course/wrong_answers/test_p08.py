"""Plausible wrong answers to phase 08 (the vectorized sampler): each must fail its check, saying where."""

from __future__ import annotations

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

WRONG = [
    # apply_temperature
    Wrong("apply_temperature", "no guard for greedy rows (divides by 0)",
          edit=("    if not all_random:\n        temperature = torch.where(temperature < SAMPLING_EPS, 1.0, temperature)\n",
                ""),
          expect="never by 0"),
    Wrong("apply_temperature", "multiplies by the temperature",
          edit=("return logits.div_(", "return logits.mul_("), expect="divide each row"),
    Wrong("apply_temperature", "divides the columns, not the rows",
          edit=("temperature.to(logits.dtype).unsqueeze(1)", "temperature.to(logits.dtype).mean()"),
          expect="its own temperature"),
    Wrong("apply_temperature", "greedy only at exactly 0, not below SAMPLING_EPS",
          edit=("torch.where(temperature < SAMPLING_EPS, 1.0, temperature)",
                "torch.where(temperature == 0, 1.0, temperature)"),
          expect="below SAMPLING_EPS is, not only exactly 0"),
    Wrong("apply_temperature", "clamps greedy temperatures to SAMPLING_EPS instead of dividing by 1",
          edit=("torch.where(temperature < SAMPLING_EPS, 1.0, temperature)", "temperature.clamp(min=SAMPLING_EPS)"),
          expect="never by 0 or by its tiny temperature"),
    Wrong("apply_temperature", "sets the greedy rows' temperature to 1 in the caller's tensor (in place)",
          source='''
          def apply_temperature(logits, temperature, all_random):
              if not all_random:
                  temperature[temperature < SAMPLING_EPS] = 1.0
              return logits.div_(temperature.to(logits.dtype).unsqueeze(1))
          ''', expect="do not change `temperature` in place"),
    Wrong("apply_temperature", "divides in place but returns nothing",
          edit=("    return logits.div_(", "    logits.div_("), expect="return the logits"),
    # apply_bad_words
    Wrong("apply_bad_words", "bans every token of the word, not only the last",
          edit=('logits[row, word[-1]] = -float("inf")', 'logits[row, word] = -float("inf")'),
          expect="ban only the LAST token"),
    Wrong("apply_bad_words", "prefix compared one token too early (off by one)",
          edit=("if past[len(past) - len(prefix):] == prefix:",
                "if past[len(past) - len(prefix) - 1:len(past) - 1] == prefix:"),
          expect="ENDS with [2, 3]"),
    Wrong("apply_bad_words", "ignores the prefix: bans every word's last token",
          edit=("if past[len(past) - len(prefix):] == prefix:", "if True:"),
          expect="does not END with"),
    Wrong("apply_bad_words", "length guard off by one: a prefix as long as the output never matches",
          edit=("if len(prefix) > len(past):", "if len(prefix) >= len(past):"),
          expect="the prefix is the whole output"),
    Wrong("apply_bad_words", "prefix found anywhere in the output, not at its end",
          source='''
          def apply_bad_words(logits, bad_words_token_ids, output_token_ids):
              for row, bad_words in bad_words_token_ids.items():
                  past = output_token_ids[row]
                  for word in bad_words:
                      prefix = word[:-1]
                      n = len(prefix)
                      if any(past[i:i + n] == prefix for i in range(len(past) - n + 1)):
                          logits[row, word[-1]] = -float("inf")
              return logits
          ''', expect="occurs earlier in it, but only the end counts"),
    Wrong("apply_bad_words", "an empty prefix compared with the whole output (`past[-0:]`)",
          edit=("if past[len(past) - len(prefix):] == prefix:", "if past[-len(prefix):] == prefix:"),
          expect="its prefix is empty"),
    Wrong("apply_bad_words", "stops at the first banned word of a row",
          edit=('                logits[row, word[-1]] = -float("inf")\n',
                '                logits[row, word[-1]] = -float("inf")\n                break\n'),
          expect="ends the bad word [2, 3, 4] of row 0"),
    Wrong("apply_bad_words", "compares the prefix with the START of the output",
          edit=("if past[len(past) - len(prefix):] == prefix:", "if past[:len(prefix)] == prefix:"),
          expect="ENDS with [2, 3]"),
    # apply_top_k_top_p
    Wrong("apply_top_k_top_p", "top-p cut with < where the rule is <=",
          edit=("drop = cumulative <= drop_threshold", "drop = cumulative < drop_threshold"),
          expect="<=, not <"),
    Wrong("apply_top_k_top_p", "no p < 1 guard (drops an underflowing token at p = 1)",
          edit=("drop_threshold = torch.where(p >= 1.0, -1.0, 1.0 - p).unsqueeze(1)",
                "drop_threshold = (1.0 - p).unsqueeze(1)"),
          expect="underflows to 0"),
    Wrong("apply_top_k_top_p", "top-k drops the ties of the k-th value",
          edit=("sorted_logits < kth_largest", "sorted_logits <= kth_largest"), expect="k-th largest"),
    Wrong("apply_top_k_top_p", "the most likely token is not always kept",
          edit=("        drop[:, -1] = False\n", ""), expect="it is always kept"),
    Wrong("apply_top_k_top_p", "a Python loop over rows",
          source='''
          def apply_top_k_top_p(logits, k, p):
              vocab_size = logits.shape[1]
              for row in range(logits.shape[0]):
                  values = logits[row]
                  if k is not None and 0 < int(k[row]) < vocab_size:
                      kth = values.topk(int(k[row])).values[-1]
                      values.masked_fill_(values < kth, -float("inf"))
                  if p is not None and float(p[row]) < 1.0:
                      sorted_values, index = values.sort()
                      cumulative = sorted_values.softmax(-1).cumsum(-1)
                      drop = cumulative <= 1.0 - float(p[row])
                      drop[-1] = False
                      values[index[drop]] = -float("inf")
              return logits
          ''', expect="branch-free"),
    Wrong("apply_top_k_top_p", "top-p on the whole row, not on the top-k survivors",
          source='''
          def apply_top_k_top_p(logits, k, p):
              if k is None and p is None:
                  return logits
              vocab_size = logits.shape[1]
              sorted_logits, sorted_index = logits.sort(dim=-1, descending=False)
              whole_row = sorted_logits.clone()
              if k is not None:
                  k = torch.where((k <= 0) | (k >= vocab_size), vocab_size, k.long())
                  kth_largest = sorted_logits.gather(1, (vocab_size - k).unsqueeze(1))
                  sorted_logits.masked_fill_(sorted_logits < kth_largest, -float("inf"))
              if p is not None:
                  drop_threshold = torch.where(p >= 1.0, -1.0, 1.0 - p).unsqueeze(1)
                  drop = whole_row.softmax(dim=-1).cumsum(dim=-1) <= drop_threshold
                  drop[:, -1] = False
                  sorted_logits.masked_fill_(drop, -float("inf"))
              return logits.scatter_(dim=-1, index=sorted_index, src=sorted_logits)
          ''', expect="top-p acts on the top-k survivors"),
    Wrong("apply_top_k_top_p", "one k for the whole batch (the largest)",
          edit=("sorted_logits.gather(1, (vocab_size - k).unsqueeze(1))",
                "sorted_logits.gather(1, (vocab_size - k.max()).repeat(k.shape[0]).unsqueeze(1))"),
          expect="outside the top-2"),
    Wrong("apply_top_k_top_p", "returns the sorted rows (no scatter back to the token ids)",
          edit=("    return logits.scatter_(dim=-1, index=sorted_index, src=sorted_logits)\n",
                "    return sorted_logits\n"),
          expect="vocabulary order"),
    Wrong("apply_top_k_top_p", "k <= 0 not treated as off",
          edit=("k = torch.where((k <= 0) | (k >= vocab_size), vocab_size, k)",
                "k = torch.where(k >= vocab_size, vocab_size, k)"),
          expect="k <= 0 or k >= the vocabulary size means no top-k"),
    Wrong("apply_top_k_top_p", "p where 1 - p belongs (keeps the least likely mass)",
          edit=("torch.where(p >= 1.0, -1.0, 1.0 - p)", "torch.where(p >= 1.0, -1.0, p)"),
          expect="nucleus"),
    # random_sample
    Wrong("random_sample", "seeded rows drawn from the global generator",
          edit=("        exponentials_(noise[row], generator)\n", "        exponentials_(noise[row])\n"),
          expect="seeded rows"),
    Wrong("random_sample", "multiplies by the noise instead of dividing",
          edit=("return probs.div_(noise)", "return probs.mul_(noise)"), expect="divides probs by Exp(1) draws"),
    Wrong("random_sample", "torch.multinomial, ignoring the generators",
          source='''
          def random_sample(probs, generators):
              return torch.multinomial(probs, 1).view(-1)
          ''', expect="seeded rows"),
    Wrong("random_sample", "argmin: the smallest ratio wins",
          edit=("return probs.div_(noise).argmax(dim=-1)", "return probs.div_(noise).argmin(dim=-1)"),
          expect="the largest wins"),
    Wrong("random_sample", "uniform noise instead of Exp(1)",
          source='''
          def random_sample(probs, generators):
              noise = torch.rand_like(probs)
              for row, generator in generators.items():
                  noise[row].uniform_(generator=generator)
              return probs.div_(noise).argmax(dim=-1).view(-1)
          ''', expect="divides probs by Exp(1) draws"),
    Wrong("random_sample", "returns [N, 1] (argmax with keepdim)",
          edit=("argmax(dim=-1).view(-1)", "argmax(dim=-1, keepdim=True)"),
          expect="not [N, 1]"),
    Wrong("random_sample", "generators taken by position in the dict, not by their row key",
          edit=("    for row, generator in generators.items():\n",
                "    for row, generator in enumerate(generators.values()):\n"),
          expect="seeded rows"),
    # gather_logprobs
    Wrong("gather_logprobs", "rank counts only strictly larger logprobs",
          edit=("ranks = (logprobs >= token_logprobs).sum(dim=-1)", "ranks = (logprobs > token_logprobs).sum(dim=-1)"),
          expect="selected_token_ranks"),
    Wrong("gather_logprobs", "no sampled-token column",
          source='''
          def gather_logprobs(logprobs, num_logprobs, token_ids):
              if num_logprobs == -1:
                  num_logprobs = logprobs.shape[-1]
              token_ids = token_ids.to(torch.int64).view(-1, 1)
              ranks = (logprobs >= logprobs.gather(-1, token_ids)).sum(dim=-1)
              top_logprobs, top_ids = logprobs.topk(max(num_logprobs, 1), dim=-1)
              return LogprobsTensors(top_ids, top_logprobs, ranks)
          ''', expect="column 0 the sampled token"),
    Wrong("gather_logprobs", "num_logprobs = -1 not handled",
          edit=("    if num_logprobs == -1:\n        num_logprobs = logprobs.shape[-1]\n", ""),
          expect="num_logprobs = -1 means the whole vocabulary"),
    Wrong("gather_logprobs", "top-n least likely first (topk largest=False)",
          edit=("logprobs.topk(num_logprobs, dim=-1)", "logprobs.topk(num_logprobs, dim=-1, largest=False)"),
          expect="most likely first"),
    Wrong("gather_logprobs", "rank from an argsort position (ties get an arbitrary rank)",
          edit=("ranks = (logprobs >= token_logprobs).sum(dim=-1)",
                "ranks = (logprobs.argsort(dim=-1, descending=True) == token_ids).nonzero()[:, 1] + 1"),
          expect="tied tokens share the worse rank"),
    Wrong("gather_logprobs", "ranks shaped [N, 1]",
          edit=("ranks = (logprobs >= token_logprobs).sum(dim=-1)",
                "ranks = (logprobs >= token_logprobs).sum(dim=-1, keepdim=True)"),
          expect="selected_token_ranks shape"),
    Wrong("gather_logprobs", "num_logprobs = -1 read as vocab_size - 1",
          edit=("num_logprobs = logprobs.shape[-1]", "num_logprobs = logprobs.shape[-1] - 1"),
          expect="num_logprobs = -1 means the whole vocabulary"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("08_sampler", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)


def _outputs(*token_lists, logprobs=None):
    from types import SimpleNamespace

    return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(tokens), logprobs=logprobs)])
            for tokens in token_lists]


def test_a_failing_plug_names_the_request_the_step_and_both_tokens():
    from labs.checks.p08 import expect_same_generations
    from mini import SamplingParams

    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0, bad_words=["of the"])]
    expect_same_generations(["a", "b"], params, _outputs([1, 2], [3, 4, 5]), _outputs([1, 2], [3, 4, 5]))
    with pytest.raises(AssertionError) as failure:
        expect_same_generations(["a", "b"], params, _outputs([1, 2], [3, 4, 5]), _outputs([1, 2], [3, 9, 5]))
    message = str(failure.value)
    assert "request 1 differs at step 1" in message and "expected: 4" in message and "got:      9" in message
    assert "bad_words" in message and "'b'" in message
    with pytest.raises(AssertionError, match="request 0 differs at step 2"):
        expect_same_generations(["a"], params[:1], _outputs([1, 2, 7]), _outputs([1, 2]))
