"""flashfuse.generation (CPU tier: tiny random models in fp32, kernels in Triton's interpreter).

Greedy tokens from the paged-cache Generator equal Hugging Face ``generate(do_sample=False)`` token for token,
for each supported family, odd prompt lengths, pages smaller than a sequence (so the block table matters);
bad arguments raise with the value and what is supported.
"""

import pytest
import torch
import transformers

from flashfuse.generation import Generator, PagedKVCache

VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS, INTERMEDIATE = 96, 64, 4, 2, 2, 80
COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, pad_token_id=0, bos_token_id=1,
              eos_token_id=None, max_position_embeddings=128)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(COMMON, tie_word_embeddings=True)),
    "llama-bias": ("LlamaConfig", "LlamaForCausalLM", dict(COMMON, attention_bias=True, mlp_bias=True)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(COMMON, sliding_window=6)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(COMMON)),     # q/k/v projections with biases
}


def build(family):
    config_cls, model_cls, kwargs = FAMILIES[family]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**kwargs, attn_implementation="eager")
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():       # O(1) logits with clear winners: greedy choices far from ties
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


def hf_greedy(model, prompt, n):
    out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[:, prompt.shape[1]:]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_greedy_tokens_match_hf_generate(family):
    model = build(family)
    prompt = torch.randint(3, VOCAB, (2, 5), generator=torch.Generator().manual_seed(1))
    gen = Generator(model, batch=2, max_seqlen=16, page_size=4)   # 4 pages per sequence, shuffled
    ours = gen.generate(prompt, 9)
    assert ours.shape == (2, 9) and ours.dtype == torch.long
    assert torch.equal(ours, hf_greedy(model, prompt, 9))
    # the cache holds prompt + all but the last generated token, in the pages the block table names
    assert gen.cache.seqlens.tolist() == [5 + 8, 5 + 8]
    again = gen.generate(prompt[:, :3], 4)                         # reuse: the cache is reset per call
    assert torch.equal(again, hf_greedy(model, prompt[:, :3], 4))


def test_block_table_is_a_permutation_of_the_pages():
    cache = PagedKVCache(2, batch=3, max_seqlen=20, nheads_k=2, head_dim=8, dtype=torch.float32, device="cpu",
                         page_size=8)
    assert cache.block_table.shape == (3, 3) and cache.max_seqlen == 24
    assert sorted(cache.block_table.flatten().tolist()) == list(range(9))
    assert cache.k[0].shape == (9, 8, 2, 8) and len(cache.v) == 2


@pytest.mark.parametrize("kwargs, message", [
    (dict(page_size=12), "page_size is 12; supported: a power of two"),
])
def test_bad_cache_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PagedKVCache(1, 1, 16, 1, 8, dtype=torch.float32, device="cpu", **kwargs)


def test_bad_generate_arguments():
    model = build("llama")
    gen = Generator(model, batch=2, max_seqlen=8, page_size=4)
    with pytest.raises(ValueError, match=r"input_ids has shape \(3, 4\); expected \(2, prompt_len\)"):
        gen.generate(torch.ones(3, 4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="prompt_len \\+ max_new_tokens is 10; supported"):
        gen.generate(torch.ones(2, 4, dtype=torch.long), 6)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=50))
    with pytest.raises(ValueError, match="model_type is 'gpt2'; Generator supports llama, mistral, qwen2"):
        Generator(gpt2, batch=1, max_seqlen=8)
    qwen = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=4))
    with pytest.raises(ValueError, match="use_sliding_window is True"):
        Generator(qwen, batch=1, max_seqlen=8)
