"""flashfuse.generation, GPU tier: the CUDA-graph decode loop gives HF generate's greedy tokens (fp32, decisive
logits), with 16-token pages and prompts that end mid-page; bf16 runs produce valid tokens and the graph path
equals the eager step path."""

import pytest
import torch
import transformers

from flashfuse.generation import Generator

pytestmark = pytest.mark.gpu

CONFIG = dict(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=2, head_dim=64, max_position_embeddings=512, pad_token_id=0, eos_token_id=None,
              bos_token_id=1, tie_word_embeddings=True)


def build(dtype):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**CONFIG, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config).cuda().eval()
    with torch.no_grad():       # decisive logits: greedy choices far from ties
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    for p in model.parameters():
        p.data = p.data.to(dtype)
    return model


def test_graph_decode_matches_hf_greedy_fp32(monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)   # HF's fp32 reference in full fp32
    model = build(torch.float32)
    prompt = torch.randint(3, 1000, (3, 37), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    gen = Generator(model, batch=3, max_seqlen=80, page_size=16)
    ours = gen.generate(prompt, 20)
    ref = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=20, do_sample=False)
    assert gen._graph is not None
    assert torch.equal(ours, ref[:, 37:])
    assert torch.equal(gen.generate(prompt, 20), ours)          # a second call replays the same graph


def test_bf16_graph_equals_eager_steps():
    model = build(torch.bfloat16)
    prompt = torch.randint(3, 1000, (2, 50), device="cuda", generator=torch.Generator("cuda").manual_seed(2))
    graphed = Generator(model, batch=2, max_seqlen=128, page_size=16).generate(prompt, 30)
    eager = Generator(model, batch=2, max_seqlen=128, page_size=16, cuda_graph=False).generate(prompt, 30)
    assert graphed.min() >= 0 and graphed.max() < 1000
    assert torch.equal(graphed, eager)
