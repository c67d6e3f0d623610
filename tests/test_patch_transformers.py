"""patch_transformers on tiny random transformers models (CPU tier, fp32; kernels in Triton's interpreter).

Every family of the table: patched logits, loss and every parameter gradient against the unpatched model run in
float64; the modules really swapped (counted) with the same Parameter objects; unpatch restores the original
objects, function, attention implementation and bit-identical outputs. Plus flags, the context manager, the
causal-LM loss options (ignore_index, num_items_in_batch, shift_labels, eval mode, return_dict) and a short
AdamW run, patched vs unpatched.
"""

import copy

import pytest
import torch
import transformers
from torch import nn

import flashfuse.nn as ffnn
from flashfuse.integrations import patch_transformers, patched, unpatch_transformers
from flashfuse.integrations.transformers import SUPPORTED_FAMILIES, Conv1DMLP, GateUpMLP
from testing import rel_err  # noqa: E402

VOCAB, HIDDEN, HEADS, KV_HEADS, LAYERS, INTERMEDIATE = 128, 64, 4, 2, 2, 96
BATCH, SEQ = 2, 7  # odd length; kept small: the kernels run in the interpreter

COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
              num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, pad_token_id=0, bos_token_id=1,
              eos_token_id=2, tie_word_embeddings=False)

# family -> (config class, model class, config kwargs, HF norm count, HF MLP class name, flashfuse MLP class)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(COMMON), 2 * LAYERS + 1, "LlamaMLP", ffnn.SwiGLUMLP),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(COMMON, sliding_window=None, tie_word_embeddings=True),
                2 * LAYERS + 1, "MistralMLP", ffnn.SwiGLUMLP),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(COMMON), 2 * LAYERS + 1, "Qwen2MLP", ffnn.SwiGLUMLP),
    # per-head q_norm and k_norm in every layer
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(COMMON, head_dim=16), 4 * LAYERS + 1, "Qwen3MLP",
              ffnn.SwiGLUMLP),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", dict(COMMON, head_dim=16, hidden_act="gelu_pytorch_tanh"),
              2 * LAYERS + 1, "GemmaMLP", ffnn.GeGLUMLP),
    # small softcaps so that forgetting one shows; sliding window shorter than SEQ on the sliding layers
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",
               dict(COMMON, head_dim=16, query_pre_attn_scalar=16, attn_logit_softcapping=5.0,
                    final_logit_softcapping=3.0, sliding_window=4, hidden_activation="gelu_pytorch_tanh"),
               4 * LAYERS + 1, "Gemma2MLP", ffnn.GeGLUMLP),
    # partial rotary: half of the head dim rotates, the rest passes through
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(COMMON, partial_rotary_factor=0.5), 2 * LAYERS + 1, "Phi3MLP",
             GateUpMLP),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel",
             dict(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_inner=INTERMEDIATE,
                  n_positions=64, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=1, eos_token_id=2),
             2 * LAYERS + 1, "GPT2MLP", Conv1DMLP),
}
FLASHFUSE_NORMS = (ffnn.RMSNorm, ffnn.LayerNorm)
FLASHFUSE_MLPS = (ffnn.SwiGLUMLP, ffnn.GeGLUMLP, GateUpMLP, Conv1DMLP)


def build(family):
    """A tiny random model, eager attention (the exact-math reference), every parameter perturbed so that norm
    weights are not all ones/zeros and the logits are O(1)."""
    config_cls, model_cls, kwargs, *_ = FAMILIES[family]
    config = getattr(transformers, config_cls)(**kwargs)
    model = getattr(transformers, model_cls)(config)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def inputs():
    ids = torch.randint(3, VOCAB, (BATCH, SEQ))
    labels = ids.clone()
    labels[0, :3] = -100  # a masked prompt
    labels[1, 4] = -100
    return ids, labels


@pytest.fixture(autouse=True)
def _no_leaked_function_patches():
    """The rope rebinding is process-wide and reference counted per patched model; a model patched in another
    test file and dropped without unpatching (the benchmark's CPU run does that) keeps it bound. Each test here
    starts from transformers' own functions."""
    from flashfuse.integrations import transformers as integration
    for (module, name), (original, _count) in list(integration._FUNCTION_PATCHES.items()):
        setattr(__import__(module, fromlist=["x"]), name, original)
    integration._FUNCTION_PATCHES.clear()
    yield


def hf_norms(model):
    return [m for m in model.modules()
            if type(m).__module__.startswith("transformers.") and type(m).__name__.endswith("RMSNorm")
            or type(m) is nn.LayerNorm]


def rope_function(family):
    return getattr(__import__(f"transformers.models.{family}.modeling_{family}", fromlist=["x"]),
                   "apply_rotary_pos_emb", None)


def reference(model, ids, labels):
    """Unpatched model in float64: logits (eval, no labels), loss and gradients (train, labels)."""
    ref = copy.deepcopy(model).double()
    with torch.no_grad():
        logits = ref.eval()(ids).logits
    loss = ref.train()(ids, labels=labels).loss
    loss.backward()
    return logits, loss.detach(), {n: p.grad for n, p in ref.named_parameters()}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_patched_matches_unpatched(family):
    model = build(family)
    ids, labels = inputs()
    ref_logits, ref_loss, ref_grads = reference(model, ids, labels)
    with torch.no_grad():
        before_logits = model.eval()(ids).logits

    modules_before = dict(model.named_modules())
    params_before = dict(model.named_parameters())
    state_keys = list(model.state_dict())
    rope_before = rope_function(family)
    n_norms, mlp_name, mlp_cls = FAMILIES[family][3], FAMILIES[family][4], FAMILIES[family][5]
    assert len(hf_norms(model)) == n_norms

    assert patch_transformers(model) is model
    # swapped in place: counted, same Parameter objects under the same names, same state-dict keys
    assert len(hf_norms(model)) == 0
    assert sum(isinstance(m, FLASHFUSE_NORMS) for m in model.modules()) == n_norms
    assert sum(type(m).__name__ == mlp_name for m in model.modules()) == 0  # HF's class names differ from ours
    assert sum(type(m) is mlp_cls for m in model.modules()) == LAYERS
    after = dict(model.named_parameters())
    assert after.keys() == params_before.keys() and all(after[k] is params_before[k] for k in after)
    assert list(model.state_dict()) == state_keys
    assert model.config._attn_implementation == "flashfuse"
    assert "forward" in model.__dict__
    fused_layers = [m for m in model.modules() if "forward" in m.__dict__ and m is not model]
    assert len(fused_layers) == (0 if family in ("gemma2", "gpt2") else LAYERS)  # the fused residual add
    if family == "gpt2":
        assert rope_before is None
    else:
        assert rope_function(family) is not rope_before

    with torch.no_grad():
        logits = model.eval()(ids).logits
    assert rel_err(logits, ref_logits) < 1e-4
    out = model.train()(ids, labels=labels)
    assert out.logits is None  # the fused loss never materializes the logits
    assert rel_err(out.loss, ref_loss) < 1e-4
    out.loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert rel_err(p.grad, ref_grads[name]) < 1e-3, name

    assert unpatch_transformers(model) is model
    modules_after = dict(model.named_modules())
    assert modules_after.keys() == modules_before.keys()
    assert all(modules_after[k] is modules_before[k] for k in modules_before)
    assert all(p is params_before[n] for n, p in model.named_parameters())
    assert rope_function(family) is rope_before
    assert model.config._attn_implementation == "eager"
    assert not any("forward" in m.__dict__ for m in model.modules())
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, before_logits)


def test_flags_norms_only():
    model = build("llama")
    ids, _ = inputs()
    with torch.no_grad():
        ref = copy.deepcopy(model).double().eval()(ids).logits
    rope_before = rope_function("llama")
    patch_transformers(model, norms=True, rope=False, mlp=False, attention=False, cross_entropy=False)
    assert sum(isinstance(m, ffnn.RMSNorm) for m in model.modules()) == 2 * LAYERS + 1
    assert sum(type(m).__name__ == "LlamaMLP" for m in model.modules()) == LAYERS
    assert rope_function("llama") is rope_before
    assert model.config._attn_implementation == "eager"
    assert "forward" not in model.__dict__
    with torch.no_grad():
        assert rel_err(model.eval()(ids).logits, ref) < 1e-4
    unpatch_transformers(model)
    assert sum(type(m).__name__ == "LlamaRMSNorm" for m in model.modules()) == 2 * LAYERS + 1


@pytest.mark.parametrize("flag", ["rope", "mlp", "attention", "cross_entropy"])
def test_flags_one_at_a_time(flag):
    model = build("qwen3")
    ids, labels = inputs()
    ref_logits, ref_loss, _ = reference(model, ids, labels)
    rope_before = rope_function("qwen3")
    flags = dict(norms=False, rope=False, mlp=False, attention=False, cross_entropy=False)
    flags[flag] = True
    with patched(model, **flags):
        assert len(hf_norms(model)) == 4 * LAYERS + 1  # norms untouched
        assert (rope_function("qwen3") is not rope_before) == (flag == "rope")
        assert (sum(isinstance(m, ffnn.SwiGLUMLP) for m in model.modules()) == LAYERS) == (flag == "mlp")
        assert (model.config._attn_implementation == "flashfuse") == (flag == "attention")
        assert ("forward" in model.__dict__) == (flag == "cross_entropy")
        with torch.no_grad():
            assert rel_err(model.eval()(ids).logits, ref_logits) < 1e-4
        out = model.train()(ids, labels=labels)
        assert (out.logits is None) == (flag == "cross_entropy")
        assert rel_err(out.loss, ref_loss) < 1e-4
    assert rope_function("qwen3") is rope_before
    assert model.config._attn_implementation == "eager" and "forward" not in model.__dict__


def test_context_manager_restores_on_error_and_nests():
    model = build("llama")
    norms = hf_norms(model)
    with pytest.raises(RuntimeError, match="inside"):
        with patched(model, attention=False) as m:
            assert m is model and len(hf_norms(model)) == 0
            raise RuntimeError("inside the block")
    assert hf_norms(model) == norms and "_flashfuse_patch" not in model.__dict__
    # a patched model entering `patched` gets its own patch back on exit
    patch_transformers(model, mlp=False, attention=False)
    with patched(model, attention=False):
        assert sum(isinstance(m, ffnn.SwiGLUMLP) for m in model.modules()) == LAYERS
    assert sum(isinstance(m, ffnn.SwiGLUMLP) for m in model.modules()) == 0
    assert len(hf_norms(model)) == 0
    unpatch_transformers(model)
    assert hf_norms(model) == norms


def test_repatch_and_shared_rope_refcount():
    a, b = build("llama"), build("llama")
    rope_before = rope_function("llama")
    patch_transformers(a, attention=False)
    patch_transformers(a, mlp=False, attention=False)  # re-patching replaces the earlier patch
    assert sum(isinstance(m, ffnn.SwiGLUMLP) for m in a.modules()) == 0
    patch_transformers(b, attention=False)
    c = copy.deepcopy(b)  # a copy of a patched model is patched, with its own modules and parameters
    c_params = dict(c.named_parameters())
    assert all(c_params[n] is not p for n, p in b.named_parameters())
    unpatch_transformers(a)
    unpatch_transformers(b)
    assert rope_function("llama") is not rope_before  # c still uses it
    assert sum(isinstance(m, ffnn.RMSNorm) for m in c.modules()) == 2 * LAYERS + 1
    unpatch_transformers(c)
    assert rope_function("llama") is rope_before
    assert len(hf_norms(c)) == 2 * LAYERS + 1 and "forward" not in c.__dict__
    assert all(p is c_params[n] for n, p in c.named_parameters())
    assert unpatch_transformers(b) is b  # unpatching an unpatched model is a no-op


def test_unpatched_model_of_a_patched_family_still_runs_its_own_dtypes():
    """The rebound rope serves every model of the family: a float64 model (no flashfuse kernel takes fp64)
    falls back to transformers' function and gives exactly its logits."""
    other = build("llama").double().eval()
    ids, _ = inputs()
    with torch.no_grad():
        before = other(ids).logits
    model = patch_transformers(build("llama"), attention=False)
    assert rope_function("llama") is not rope_function("llama").flashfuse_original
    with torch.no_grad():
        assert torch.equal(other(ids).logits, before)
    unpatch_transformers(model)


def test_loss_options_match_hf():
    """ignore_index, num_items_in_batch, shift_labels, return_dict=False, eval mode with labels."""
    model = build("llama")
    ref = copy.deepcopy(model).double().train()
    ids, labels = inputs()
    patch_transformers(model, norms=False, rope=False, mlp=False, attention=False)
    model.train()
    shift = torch.randint(0, VOCAB, (BATCH, SEQ))
    shift[:, ::4] = 7
    cases = [
        dict(labels=labels, num_items_in_batch=torch.tensor(9)),
        dict(labels=torch.where(labels == -100, 5, labels), ignore_index=5),
        dict(labels=labels, shift_labels=shift, ignore_index=7),  # shift_labels replaces the shifted labels
    ]
    for kwargs in cases:
        out = model(ids, **kwargs)
        assert out.logits is None
        assert rel_err(out.loss, ref(ids, **kwargs).loss) < 1e-4, kwargs
    loss, *rest = model(ids, labels=labels, return_dict=False)
    assert loss.ndim == 0 and rel_err(loss, ref(ids, labels=labels).loss) < 1e-4
    model.eval()  # eval: HF's forward, logits returned
    out = model(ids, labels=labels)
    assert out.logits.shape == (BATCH, SEQ, VOCAB)
    assert rel_err(out.loss, ref.eval()(ids, labels=labels).loss) < 1e-4
    model.train()
    with pytest.raises(ValueError, match="label positions"):
        model(ids, labels=labels, logits_to_keep=4)
    # a custom loss_function: HF's forward, which calls it on the logits
    model.loss_function = lambda logits, labels, vocab_size, **kwargs: logits.float().square().mean()
    out = model(ids, labels=labels)
    assert rel_err(out.loss, ref.train()(ids).logits.square().mean()) < 1e-4


def test_compiled_training_step_matches_eager():
    """torch.compile(fullgraph=True) traces the generic forward (GPT-2: no loss_type, whose warning in HF's
    loss_function property would break the graph); aot_eager runs the same kernels, so the results agree."""
    model = patch_transformers(build("gpt2")).train()
    ids, labels = inputs()

    def step(ids, labels):
        return model(ids, labels=labels).loss

    eager = step(ids, labels)
    eager.backward()
    eager_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)(ids, labels)
    compiled.backward()
    assert rel_err(compiled, eager) < 1e-6
    for p, g in zip(model.parameters(), eager_grads):
        assert rel_err(p.grad, g) < 1e-6


def test_generate_matches():
    model = build("llama").eval()
    ids, _ = inputs()
    kwargs = dict(max_new_tokens=4, do_sample=False, pad_token_id=0)
    expected = model.generate(ids, **kwargs)
    with patched(model):
        assert torch.equal(model.generate(ids, **kwargs), expected)


def test_optimizer_built_before_patching_trains_same_curve():
    """20 AdamW steps of a one-layer Llama on a learnable synthetic stream (each row counts up from a random
    token), patched vs unpatched; the optimizers are built before patching. Tiny: every step runs all the
    patched kernels, forward and backward, in the interpreter."""
    config = transformers.LlamaConfig(**dict(COMMON, num_hidden_layers=1))
    ref_model = transformers.LlamaForCausalLM(config)
    ref_model.set_attn_implementation("eager")
    model = copy.deepcopy(ref_model)
    ref_opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    patch_transformers(model)
    ref_model.train(), model.train()
    ids = (torch.randint(3, VOCAB, (2, 1)) + torch.arange(6)) % (VOCAB - 3) + 3
    losses, ref_losses = [], []
    for _ in range(20):
        for m, o, curve in ((ref_model, ref_opt, ref_losses), (model, opt, losses)):
            o.zero_grad()
            loss = m(ids, labels=ids).loss
            loss.backward()
            o.step()
            curve.append(loss.item())
    ref_losses, losses = torch.tensor(ref_losses), torch.tensor(losses)
    assert ref_losses[-1] < 0.5 * ref_losses[0]  # it learns
    assert ((losses - ref_losses).abs() / ref_losses).max() < 2e-3
    unpatch_transformers(model)
    assert all(p is q for p, q in zip(model.parameters(), opt.param_groups[0]["params"]))


def test_wrapped_projections_are_left_alone():
    """A projection that is not a plain Linear (LoRA, quantized: its forward is more than its .weight) keeps
    its MLP unpatched, with a warning; a wrapped lm_head keeps HF's loss path."""
    class Wrapped(nn.Linear):
        def forward(self, x):
            return super().forward(x) + 1.0

    model = build("llama")
    layer = model.model.layers[0].mlp
    wrapped = Wrapped(HIDDEN, INTERMEDIATE, bias=False)
    layer.gate_proj = wrapped
    model.lm_head = Wrapped(HIDDEN, VOCAB, bias=False)
    ids, labels = inputs()
    ref = copy.deepcopy(model).double().train()
    with pytest.warns(UserWarning, match="LlamaMLP left as it is: gate_proj is Wrapped, not Linear"):
        patch_transformers(model, norms=False, rope=False, attention=False)
    assert model.model.layers[0].mlp is layer and isinstance(model.model.layers[1].mlp, ffnn.SwiGLUMLP)
    out = model.train()(ids, labels=labels)
    assert out.logits is not None
    assert rel_err(out.loss, ref(ids, labels=labels).loss) < 1e-4


@pytest.mark.parametrize("family", ["llama", "phi3"])
@pytest.mark.parametrize("enable_first", [False, True])
def test_gradient_checkpointing_recomputes(family, enable_first):
    """HF's gradient_checkpointing_enable() on a patched model (enabled before or after patching): every
    decoder layer runs its forward again in the backward (attention counted), and the loss and every gradient
    equal the float64 reference. (The fused decoder forward replaces the class forward that transformers 5
    checkpoints inside; it must checkpoint itself, or checkpointing silently keeps every activation.)"""
    model = build(family)
    ids, labels = inputs()
    _, ref_loss, ref_grads = reference(model, ids, labels)
    if enable_first:
        model.gradient_checkpointing_enable()
    patch_transformers(model)
    if not enable_first:
        model.gradient_checkpointing_enable()
    calls = []
    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(lambda *args: calls.append(1))
    loss = model.train()(ids, labels=labels).loss
    assert len(calls) == LAYERS
    loss.backward()
    assert len(calls) == 2 * LAYERS          # recomputed in the backward
    assert rel_err(loss, ref_loss) < 1e-4               # the family test's fp32-vs-float64 bounds
    for name, p in model.named_parameters():
        assert rel_err(p.grad, ref_grads[name]) < 1e-3, name
    model.gradient_checkpointing_disable()
    calls.clear()
    model(ids, labels=labels).loss.backward()
    assert len(calls) == LAYERS
    unpatch_transformers(model)


def test_errors():
    with pytest.raises(TypeError, match="PreTrainedModel"):
        patch_transformers(nn.Linear(2, 2))
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=32))
    with pytest.raises(ValueError, match="supported: " + ", ".join(SUPPORTED_FAMILIES)):
        patch_transformers(bert)
    assert "_flashfuse_patch" not in bert.__dict__
