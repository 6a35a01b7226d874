"""Phase 00's checks reject plausible wrong answers (each fails with a message that locates the bug)."""

import pytest

from tests.course.fidelity import Wrong, assert_wrong_fails, wrong_params

NO_CACHE_PASSED = '''
def generate_with_kv_cache(model, prompt_token_ids, max_new_tokens):
    out = model(input_ids=torch.tensor([list(prompt_token_ids)]), use_cache=True)
    new_tokens = [int(out.logits[0, -1].argmax())]
    while len(new_tokens) < max_new_tokens:
        out = model(input_ids=torch.tensor([[new_tokens[-1]]]), use_cache=True)
        new_tokens.append(int(out.logits[0, -1].argmax()))
    return new_tokens
'''

WHOLE_SEQUENCE_WITH_CACHE = '''
def generate_with_kv_cache(model, prompt_token_ids, max_new_tokens):
    ids, cache, new_tokens = list(prompt_token_ids), None, []
    for _ in range(max_new_tokens):
        out = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
        cache = out.cache
        new_tokens.append(int(out.logits[0, -1].argmax()))
        ids.append(new_tokens[-1])
    return new_tokens
'''

ONE_CALL_TOO_MANY = '''
def generate_with_kv_cache(model, prompt_token_ids, max_new_tokens):
    out = model(input_ids=torch.tensor([list(prompt_token_ids)]), use_cache=True)
    new_tokens = [int(out.logits[0, -1].argmax())]
    for _ in range(max_new_tokens):
        out = model(input_ids=torch.tensor([[new_tokens[-1]]]), cache=out.cache, use_cache=True)
        new_tokens.append(int(out.logits[0, -1].argmax()))
    return new_tokens[:max_new_tokens]
'''

WRONG_TOKEN_FED = '''
def generate_with_kv_cache(model, prompt_token_ids, max_new_tokens):
    out = model(input_ids=torch.tensor([list(prompt_token_ids)]), use_cache=True)
    new_tokens = [int(out.logits[0, -1].argmax())]
    while len(new_tokens) < max_new_tokens:
        out = model(input_ids=torch.tensor([[prompt_token_ids[-1]]]), cache=out.cache, use_cache=True)
        new_tokens.append(int(out.logits[0, -1].argmax()))
    return new_tokens
'''

FRESH_CACHE_EACH_CALL = '''
def generate_with_kv_cache(model, prompt_token_ids, max_new_tokens):
    from transformers import DynamicCache
    out = model(input_ids=torch.tensor([list(prompt_token_ids)]), use_cache=True)
    new_tokens = [int(out.logits[0, -1].argmax())]
    while len(new_tokens) < max_new_tokens:
        out = model(input_ids=torch.tensor([[new_tokens[-1]]]), cache=DynamicCache(), use_cache=True)
        new_tokens.append(int(out.logits[0, -1].argmax()))
    return new_tokens
'''

PREFILL_ALL_BUT_THE_LAST = '''
def generate_with_kv_cache(model, prompt_token_ids, max_new_tokens):
    out = model(input_ids=torch.tensor([list(prompt_token_ids[:-1])]), use_cache=True)
    new_tokens, last = [], prompt_token_ids[-1]
    while len(new_tokens) < max_new_tokens:
        out = model(input_ids=torch.tensor([[last]]), cache=out.cache, use_cache=True)
        last = int(out.logits[0, -1].argmax())
        new_tokens.append(last)
    return new_tokens
'''

APPENDS_TO_THE_PROMPT = '''
def generate_with_kv_cache(model, prompt_token_ids, max_new_tokens):
    ids = prompt_token_ids
    out = model(input_ids=torch.tensor([ids]), use_cache=True)
    ids.append(int(out.logits[0, -1].argmax()))
    for _ in range(max_new_tokens - 1):
        out = model(input_ids=torch.tensor([ids[-1:]]), cache=out.cache, use_cache=True)
        ids.append(int(out.logits[0, -1].argmax()))
    return ids[len(ids) - max_new_tokens:]
'''

WRONG = [
    # kv_bytes_per_block
    Wrong("kv_bytes_per_block", "no factor 2 for K and V",
          edit=("return 2 * hf_config.num_hidden_layers", "return hf_config.num_hidden_layers"),
          expect="(the factor 2)"),
    Wrong("kv_bytes_per_block", "query heads instead of KV heads",
          edit=('num_kv_heads = getattr(hf_config, "num_key_value_heads", None) or num_heads',
                "num_kv_heads = num_heads"), expect="grouped-query attention"),
    Wrong("kv_bytes_per_block", "head_dim ignored",
          edit=('head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads',
                "head_size = hf_config.hidden_size // num_heads"), expect="when the config sets it"),
    Wrong("kv_bytes_per_block", "per token, not per block",
          edit=("hf_config.num_hidden_layers * config.block_size *", "hf_config.num_hidden_layers *"),
          expect="a block holds block_size tokens"),
    Wrong("kv_bytes_per_block", "true division: a float", edit=("hf_config.hidden_size // num_heads",
                                                                  "hf_config.hidden_size / num_heads"),
          expect="of the wrong type"),
    Wrong("kv_bytes_per_block", "two bytes per number whatever the dtype",
          edit=("element_size = torch.empty((), dtype=config.torch_dtype).element_size()", "element_size = 2"),
          expect="the element size comes from config.torch_dtype"),
    Wrong("kv_bytes_per_block", "one layer only",
          edit=("return 2 * hf_config.num_hidden_layers * ", "return 2 * "), expect="a block spans every layer"),
    Wrong("kv_bytes_per_block", "head_dim read without a fallback",
          edit=('head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads',
                "head_size = hf_config.head_dim"), expect="Qwen2's has no head_dim attribute"),
    # generate_naive
    Wrong("generate_naive", "appends to the caller's prompt list",
          edit=("ids = list(prompt_token_ids)", "ids = prompt_token_ids"), expect="changed the list it was given"),
    Wrong("generate_naive", "argmax over the whole logits tensor",
          edit=("token = int(logits[0, -1].argmax())", "token = int(logits.argmax())"), expect="ONE position's row"),
    Wrong("generate_naive", "a 1-D input_ids tensor",
          edit=("logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits",
                "logits = model(input_ids=torch.tensor(ids), use_cache=False).logits"), expect="shape [1, n]"),
    Wrong("generate_naive", "returns the prompt too",
          edit=("    return new_tokens\n", "    return ids\n"), expect="return ONLY the new token ids"),
    Wrong("generate_naive", "feeds only the newest token",
          edit=("logits = model(input_ids=torch.tensor([ids]), use_cache=False).logits",
                "logits = model(input_ids=torch.tensor([ids[-1:] if new_tokens else ids]), use_cache=False).logits"),
          expect="first differing model call: call 1"),
    Wrong("generate_naive", "one step too few",
          edit=("for _ in range(max_new_tokens):", "for _ in range(max_new_tokens - 1):"),
          expect="the reference makes 6 calls, yours made 5"),
    Wrong("generate_naive", "argmax of the first position",
          edit=("token = int(logits[0, -1].argmax())", "token = int(logits[0, 0].argmax())"),
          expect="first differing token: step 0"),
    Wrong("generate_naive", "the new token is not appended to the sequence",
          edit=("        ids.append(token)\n", ""), expect="first differing model call: call 1"),
    # generate_with_kv_cache
    Wrong("generate_with_kv_cache", "the cache is not passed back", source=NO_CACHE_PASSED,
          expect="must pass the `cache`"),
    Wrong("generate_with_kv_cache", "feeds the prompt's last token at every decode step", source=WRONG_TOKEN_FED,
          expect="first differing token: step 1"),
    Wrong("generate_with_kv_cache", "a fresh, empty cache at each decode step", source=FRESH_CACHE_EACH_CALL,
          expect="positions in the cache"),
    Wrong("generate_with_kv_cache", "the whole sequence fed with the cache", source=WHOLE_SEQUENCE_WITH_CACHE,
          expect="feed ONLY the newest token"),
    Wrong("generate_with_kv_cache", "one model call too many", source=ONE_CALL_TOO_MANY,
          expect="one call per token"),
    Wrong("generate_with_kv_cache", "prefills all but the last prompt token, then feeds it",
          source=PREFILL_ALL_BUT_THE_LAST, expect="prefill the prompt once"),
    Wrong("generate_with_kv_cache", "appends to the caller's prompt list", source=APPENDS_TO_THE_PROMPT,
          expect="changed the list it was given"),
    Wrong("generate_with_kv_cache", "the first token from the prompt's first position",
          edit=("new_tokens = [int(out.logits[0, -1].argmax())]", "new_tokens = [int(out.logits[0, 0].argmax())]"),
          expect="the LAST position"),
]


@pytest.mark.parametrize(("assignment_id", "wrong"), wrong_params("00_autoregressive_loop", WRONG))
def test_wrong_answer_fails_its_check(assignment_id, wrong):
    assert_wrong_fails(assignment_id, wrong)
