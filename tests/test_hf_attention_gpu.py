"""attn_implementation="flashfuse", GPU tier (`pytest -m gpu`): bf16 models of real proportions (random
weights, nothing downloaded), unpadded and left-padded, logits and every parameter gradient.

Criterion (flash-attn's, on norms): each bf16 model is compared with the same weights in fp32 eager
attention (TF32 off); flashfuse's error must be at most twice that of transformers' own bf16 attention
("sdpa", or "eager" for Gemma 2, whose softcap sdpa does not support) plus a small floor. Both bf16 runs
share everything but attention, so the gap is the attention kernels'."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, Gemma2Config, LlamaConfig, MistralConfig

from flashfuse.integrations.hf_attention import register_transformers_attention

pytestmark = pytest.mark.gpu

VOCAB, BATCH, SEQ, PAD = 4096, 2, 1024, 100
REAL = dict(vocab_size=VOCAB, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
            num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=2048)
CASES = {
    "llama": (lambda: LlamaConfig(**REAL), "sdpa"),
    "mistral-sliding": (lambda: MistralConfig(**REAL, sliding_window=256), "sdpa"),
    "gemma2-softcap-sliding": (lambda: Gemma2Config(**REAL, head_dim=64, sliding_window=256), "eager"),
}
FLOOR = 2e-3                        # bf16 rounding of logits alone is ~2e-3 relative


@pytest.fixture(autouse=True)
def _setup():
    register_transformers_attention()
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


def build(cfg, impl, dtype, state=None):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl, dtype=dtype)
    model = model.to("cuda").eval()
    if state is not None:
        model.load_state_dict(state)
    return model


def run(model, ids, mask, weights):
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=mask).logits
    keep = mask.bool()
    (logits[keep].float() * weights[keep]).sum().backward()
    return logits.detach()[keep].float(), {n: p.grad.float() for n, p in model.named_parameters()}


def rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
def test_bf16_model_matches_transformers_attention(name, padded):
    make_cfg, baseline = CASES[name]
    cfg = make_cfg()
    ref_model = build(cfg, "eager", torch.float32)
    state = {k: v.to(torch.bfloat16) for k, v in ref_model.state_dict().items()}
    ref_model.load_state_dict({k: v.float() for k, v in state.items()})   # the bf16 weights, exactly
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), device="cuda")
    mask = torch.ones(BATCH, SEQ, dtype=torch.long, device="cuda")
    if padded:
        mask[0, :PAD] = 0
    weights = torch.randn(BATCH, SEQ, VOCAB, device="cuda")
    ref_logits, ref_grads = run(ref_model, ids, mask, weights)
    del ref_model
    results = {}
    for impl in ("flashfuse", baseline):
        logits, grads = run(build(cfg, impl, torch.bfloat16, state), ids, mask, weights)
        assert torch.isfinite(logits).all(), impl
        results[impl] = (logits, grads)
    ours, theirs = results["flashfuse"], results[baseline]
    err, base = rel(ours[0], ref_logits), rel(theirs[0], ref_logits)
    assert err <= 2 * base + FLOOR, f"logits: flashfuse {err:.2e} vs {baseline} {base:.2e} (fp32 reference)"
    for pname, ref in ref_grads.items():
        assert torch.isfinite(ours[1][pname]).all(), pname
        err, base = rel(ours[1][pname], ref), rel(theirs[1][pname], ref)
        assert err <= 2 * base + FLOOR, f"d{pname}: flashfuse {err:.2e} vs {baseline} {base:.2e}"
