"""flashfuse.nn.mlp modules against the HF transformers MLPs they replace: same state dict, outputs and
every gradient (fp32, CPU tier; the kernels run in Triton's interpreter)."""

import pytest
import torch
from transformers import GemmaConfig, GPT2Config, LlamaConfig
from transformers.models.gemma.modeling_gemma import GemmaMLP
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
from transformers.models.llama.modeling_llama import LlamaMLP

from flashfuse.nn.mlp import FusedMLP, GeGLUMLP, SwiGLUMLP
from flashfuse.ops.matmul import fused_mlp
from testing import rel_err  # noqa: E402

HIDDEN, INTER = 45, 29


def compare(ours, theirs, x, params, tol=1e-5):
    """Same input through both modules: output, dx, and the gradient of every named parameter."""
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ours(x1), theirs(x2)
    assert rel_err(y1, y2) < tol
    g = torch.randn_like(y2)
    y1.backward(g)
    y2.backward(g)
    assert rel_err(x1.grad, x2.grad) < tol
    for ours_name, theirs_grad in params():
        assert rel_err(ours.get_parameter(ours_name).grad, theirs_grad) < tol, ours_name


def llama_like(hf, ours):
    ours.load_state_dict(hf.state_dict())
    names = [n for n, _ in hf.named_parameters()]
    return lambda: [(n, hf.get_parameter(n).grad) for n in names]


@pytest.mark.parametrize("mlp_bias", [False, True])
def test_swiglu_vs_llama(device, mlp_bias):
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, hidden_act="silu", mlp_bias=mlp_bias,
                      num_attention_heads=1, num_key_value_heads=1, head_dim=2)
    hf = LlamaMLP(cfg).to(device)
    ours = SwiGLUMLP(HIDDEN, INTER, bias=mlp_bias, device=device)
    compare(ours, hf, torch.randn(2, 37, HIDDEN, device=device), llama_like(hf, ours))


@pytest.mark.parametrize("trainable", ["input", "weights", "gate_only"])
def test_gate_up_projection_partial_grads(device, trainable):
    """The one-pass input gradient of the gate/up projections with frozen weights, a frozen input, and
    one projection frozen: every gradient that exists equals the two-F.linear reference, the rest stay None."""
    torch.manual_seed(0)
    ours = SwiGLUMLP(HIDDEN, INTER, bias=True, device=device)
    ref = SwiGLUMLP(HIDDEN, INTER, bias=True, device=device)
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, HIDDEN, device=device)
    for m in (ours, ref):
        for name, p in m.named_parameters():
            p.requires_grad_(trainable == "weights" or (trainable == "gate_only" and name.startswith("gate_proj")))
    x1, x2 = x.clone().requires_grad_(trainable != "weights"), x.clone().requires_grad_(trainable != "weights")

    def reference(x):
        gate = torch.nn.functional.linear(x, ref.gate_proj.weight, ref.gate_proj.bias)
        up = torch.nn.functional.linear(x, ref.up_proj.weight, ref.up_proj.bias)
        return ref.down_proj(torch.nn.functional.silu(gate) * up)

    y1, y2 = ours(x1), reference(x2)
    assert rel_err(y1, y2) < 1e-5
    g = torch.randn_like(y2)
    y1.backward(g)
    y2.backward(g)
    if trainable != "weights":
        assert rel_err(x1.grad, x2.grad) < 1e-5
    for (name, p1), p2 in zip(ours.named_parameters(), ref.parameters()):
        assert (p1.grad is None) == (p2.grad is None), name
        if p2.grad is not None:
            assert rel_err(p1.grad, p2.grad) < 1e-5, name


def test_geglu_vs_gemma(device):
    cfg = GemmaConfig(hidden_size=HIDDEN, intermediate_size=INTER, hidden_activation="gelu_pytorch_tanh",
                      num_attention_heads=1, num_key_value_heads=1, head_dim=2)
    hf = GemmaMLP(cfg).to(device)
    ours = GeGLUMLP(HIDDEN, INTER, approximate="tanh", device=device)
    compare(ours, hf, torch.randn(1, 37, HIDDEN, device=device), llama_like(hf, ours))


def test_geglu_erf_vs_hf_gated_mlp_with_exact_gelu(device):
    """HF's Gemma config maps "gelu" to the tanh form; LlamaMLP with hidden_act="gelu" is the erf GeGLU."""
    cfg = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTER, hidden_act="gelu", num_attention_heads=1,
                      num_key_value_heads=1, head_dim=2)
    hf = LlamaMLP(cfg).to(device)
    assert type(hf.act_fn).__name__ == "GELUActivation"  # the erf GELU
    ours = GeGLUMLP(HIDDEN, INTER, approximate="none", device=device)
    compare(ours, hf, torch.randn(1, 1, HIDDEN, device=device), llama_like(hf, ours))


def test_fused_mlp_vs_gpt2(device):
    """GPT2MLP's Conv1D weights (in, out) load transposed into FusedMLP (gelu_new == gelu_tanh)."""
    cfg = GPT2Config(n_embd=HIDDEN, n_head=1, activation_function="gelu_new", resid_pdrop=0.0)
    hf = GPT2MLP(INTER, cfg).to(device).eval()
    with torch.no_grad():  # GPT-2 initializes biases to zero: make them matter
        hf.c_fc.bias.normal_()
        hf.c_proj.bias.normal_()
    ours = FusedMLP(HIDDEN, INTER, activation="gelu_tanh", device=device)
    ours.load_state_dict({"fc1.weight": hf.c_fc.weight.t(), "fc1.bias": hf.c_fc.bias,
                          "fc2.weight": hf.c_proj.weight.t(), "fc2.bias": hf.c_proj.bias})
    compare(ours, hf, torch.randn(3, 37, HIDDEN, device=device),
            lambda: [("fc1.weight", hf.c_fc.weight.grad.t()), ("fc1.bias", hf.c_fc.bias.grad),
                     ("fc2.weight", hf.c_proj.weight.grad.t()), ("fc2.bias", hf.c_proj.bias.grad)])


def test_fused_mlp_functional_on_conv1d_views(device):
    """Without copying: fused_mlp straight on GPT-2's Conv1D parameters, gradients land in them."""
    cfg = GPT2Config(n_embd=HIDDEN, n_head=1, activation_function="gelu_new", resid_pdrop=0.0)
    hf = GPT2MLP(INTER, cfg).to(device).eval()
    x = torch.randn(37, HIDDEN, device=device)
    y = fused_mlp(x, hf.c_fc.weight.t(), hf.c_fc.bias, hf.c_proj.weight.t(), hf.c_proj.bias, "gelu_tanh")
    assert rel_err(y, hf(x)) < 1e-5
    g = torch.randn_like(y)
    y.backward(g)
    grads = [p.grad.clone() for p in hf.parameters()]
    hf.zero_grad()
    hf(x).backward(g)
    for ours_g, p in zip(grads, hf.parameters()):
        assert rel_err(ours_g, p.grad) < 1e-5


@pytest.mark.parametrize("activation", ["gelu", "silu", "relu"])
def test_fused_mlp_other_activations_and_out_features(device, activation):
    ours = FusedMLP(HIDDEN, INTER, out_features=23, activation=activation, device=device)
    torch_acts = {"gelu": torch.nn.GELU(), "silu": torch.nn.SiLU(), "relu": torch.nn.ReLU()}
    ref = torch.nn.Sequential(torch.nn.Linear(HIDDEN, INTER), torch_acts[activation],
                              torch.nn.Linear(INTER, 23)).to(device)
    ref.load_state_dict({"0.weight": ours.fc1.weight, "0.bias": ours.fc1.bias,
                         "2.weight": ours.fc2.weight, "2.bias": ours.fc2.bias})
    compare(ours, ref, torch.randn(37, HIDDEN, device=device),
            lambda: [("fc1.weight", ref[0].weight.grad), ("fc1.bias", ref[0].bias.grad),
                     ("fc2.weight", ref[2].weight.grad), ("fc2.bias", ref[2].bias.grad)])


def test_module_errors():
    with pytest.raises(ValueError, match=r"activation is 'swiglu'.*use SwiGLUMLP"):
        FusedMLP(8, 16, activation="swiglu")
    with pytest.raises(ValueError, match=r"activation is 'tanh'; supported: 'gelu'"):
        FusedMLP(8, 16, activation="tanh")
    with pytest.raises(ValueError, match=r"approximate is 'fast'; supported: 'tanh', 'none'"):
        GeGLUMLP(8, 16, approximate="fast")


def test_state_dict_names():
    assert set(SwiGLUMLP(8, 16).state_dict()) == {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}
    assert set(FusedMLP(8, 16).state_dict()) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
