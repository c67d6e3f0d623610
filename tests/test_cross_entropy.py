"""fused_linear_cross_entropy / cross_entropy, CPU tier: loss and every gradient (hidden, weight, bias;
logits) against float64 references on tiny odd shapes with several chunks and several vocab blocks per
row, every reduction, ignore_index rows (also all of them), label smoothing, softcap, reduction="none"
with a non-uniform grad_output, frozen inputs, NaN-poisoned kernel outputs, bad labels, argument errors,
torch.compile(fullgraph=True). Kernels run in Triton's interpreter here; the GPU tier is
test_cross_entropy_gpu.py."""

import pytest
import torch
import torch.nn.functional as F

import flashfuse.ops.cross_entropy as ce
from flashfuse.nn.loss import FusedLinearCrossEntropyLoss
from flashfuse.ops.cross_entropy import cross_entropy, cross_entropy_rows, fused_linear_cross_entropy
from flashfuse.reference.cross_entropy import cross_entropy_ref, fused_linear_cross_entropy_ref
from testing import rel_err  # noqa: E402

F32, F16 = torch.float32, torch.float16
# ||x - ref|| / ||ref||. fp32: fp32 GEMMs and an fp32 kernel (~2e-7 seen). fp16: the logits and their
# gradient are rounded to fp16 (2^-11 ~ 4.9e-4 each) and grad_weight is rounded once per chunk.
REL = {F32: 1e-5, F16: 4e-3}
N, H, V = 37, 24, 131          # odd sizes; chunk 8 -> 5 chunks (last partial), BLOCK_V 32 -> 5 blocks
CHUNK = 8
OPTIONS = [  # (label_smoothing, softcap)
    (0.0, None), (0.1, None), (0.0, 3.0), (0.25, 2.0),
]
OPTION_IDS = ["plain", "smooth", "softcap", "smooth+softcap"]


@pytest.fixture(autouse=True)
def _small_vocab_blocks(monkeypatch):
    """Several vocab blocks per row (the last one partial), as a 128k vocab has in 4096 blocks."""
    monkeypatch.setattr(ce, "MAX_BLOCK_V", 32)


def assert_close(name, x, ref, tol):
    assert x.shape == ref.shape, f"{name}: shape {tuple(x.shape)}, reference {tuple(ref.shape)}"
    assert torch.isfinite(x).all(), f"{name}: {int((~torch.isfinite(x)).sum())} NaN/Inf values"
    err = rel_err(x, ref)
    assert err <= tol, f"{name}: relative error {err:.3e} > {tol:.0e}"


def make_inputs(device, dtype=F32, n=N, h=H, v=V, bias=True, ignore=(3, 10, 36)):
    hidden = torch.randn(n, h, device=device).to(dtype).requires_grad_(True)
    weight = (torch.randn(v, h, device=device) / h ** 0.5).to(dtype).requires_grad_(True)
    b = (torch.randn(v, device=device) * 0.5).to(dtype).requires_grad_(True) if bias else None
    labels = torch.randint(0, v, (n,), device=device)
    labels[[i for i in ignore if i < n]] = -100
    return hidden, weight, b, labels


def check_flce(hidden, weight, bias, labels, *, leaves=None, to_inputs=None, **options):
    """Loss and every gradient vs the float64 reference (torch's F.cross_entropy on float64 logits).
    leaves: the tensors to differentiate (default: those of hidden, weight, bias given); to_inputs maps
    their float64 copies to (hidden, weight, bias) (default: each leaf is itself an input)."""
    leaves = leaves or [t for t in (hidden, weight, bias) if t is not None]
    out = fused_linear_cross_entropy(hidden, weight, labels, bias=bias, chunk_size=CHUNK, **options)
    assert out.dtype == F32
    dout = torch.rand_like(out) + 0.5                                 # non-uniform for "none"
    grads = torch.autograd.grad(out, leaves, dout)
    leaves64 = {id(t): t.detach().double().requires_grad_(True) for t in leaves}
    if to_inputs is not None:
        h64, w64, b64 = to_inputs(*leaves64.values())
    else:
        h64, w64, b64 = (leaves64.get(id(t), t.detach().double() if t is not None else None)
                         for t in (hidden, weight, bias))
    z = F.linear(h64, w64, b64)
    cap = options.get("softcap")
    if cap:
        z = cap * torch.tanh(z / cap)
    ref = F.cross_entropy(z.reshape(-1, z.shape[-1]), labels.reshape(-1).long(), ignore_index=options.get("ignore_index", -100),
                          reduction=options.get("reduction", "mean"),
                          label_smoothing=options.get("label_smoothing", 0.0))
    ref = ref.reshape(out.shape)
    ref_grads = torch.autograd.grad(ref, list(leaves64.values()), dout.double())
    tol = REL[hidden.dtype]
    assert_close("loss", out.detach(), ref.detach(), tol)
    for name, g, r, t in zip(("grad 0", "grad 1", "grad 2"), grads, ref_grads, leaves):
        assert g.dtype == t.dtype, f"{name}: dtype {g.dtype}, expected {t.dtype}"
        assert_close(name, g, r, tol)


# ----------------------------------------------------------------------------------------------------
# fused_linear_cross_entropy: loss and every gradient vs float64
# ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing, softcap", OPTIONS, ids=OPTION_IDS)
def test_fused_linear_all_options(reduction, label_smoothing, softcap, device):
    hidden, weight, bias, labels = make_inputs(device)
    check_flce(hidden, weight, bias, labels, reduction=reduction, label_smoothing=label_smoothing,
               softcap=softcap)


@pytest.mark.parametrize("n, h, v, dtype, bias", [
    (1, 5, 7, F32, False), (5, 24, 131, F32, False), (123, 5, 37, F32, True), (37, 24, 131, F16, True),
], ids=["1x5x7", "5x24x131", "123x5x37", "37x24x131-fp16"])
def test_fused_linear_shapes(n, h, v, dtype, bias, device):
    hidden, weight, b, labels = make_inputs(device, dtype, n, h, v, bias)
    check_flce(hidden, weight, b, labels, reduction="mean", label_smoothing=0.1, softcap=4.0)


def test_fused_linear_3d_int32_strided_causal_shift(device):
    """(batch, seqlen, H) hidden sliced for the causal shift (a strided view, not copied), (batch, seqlen)
    int32 labels; "none" returns labels' shape."""
    full = torch.randn(2, 20, H, device=device, requires_grad=True)
    weight = (torch.randn(V, H, device=device) / H ** 0.5).requires_grad_(True)
    ids = torch.randint(0, V, (2, 20), device=device, dtype=torch.int32)
    hidden, labels = full[:, :-1], ids[:, 1:]
    for reduction in ("mean", "none"):
        out = fused_linear_cross_entropy(hidden, weight, labels, reduction=reduction, chunk_size=CHUNK)
        ref = fused_linear_cross_entropy_ref(hidden.double(), weight.double(), labels, reduction=reduction)
        assert out.shape == ref.shape == ((2, 19) if reduction == "none" else ())
        assert_close(f"loss {reduction}", out.detach(), ref.detach(), REL[F32])
    check_flce(hidden, weight, None, labels, leaves=[full, weight], to_inputs=lambda f, w: (f[:, :-1], w, None))


def test_fused_linear_ignore_index_in_vocab(device):
    """ignore_index may be a real class id (torch allows it): those rows are skipped, others count."""
    hidden, weight, bias, labels = make_inputs(device, ignore=())
    labels[::3] = 5
    check_flce(hidden, weight, bias, labels, ignore_index=5, label_smoothing=0.1)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_fused_linear_all_ignored(reduction, device):
    """Every row ignored: like torch, "mean" is 0/0 = nan, "sum" 0, "none" zeros; every gradient is 0."""
    hidden, weight, bias, labels = make_inputs(device, n=9)
    labels.fill_(-100)
    out = fused_linear_cross_entropy(hidden, weight, labels, reduction=reduction, bias=bias, chunk_size=4)
    ref = F.cross_entropy(F.linear(hidden.double(), weight.double(), bias.double()), labels, reduction=reduction)
    assert torch.equal(out.isnan(), ref.isnan()) and (reduction != "mean" or out.isnan())
    if reduction != "mean":
        assert torch.equal(out.double(), ref.detach())
    grads = torch.autograd.grad(out.sum(), (hidden, weight, bias))
    for g in grads:
        assert torch.equal(g, torch.zeros_like(g))


def test_fused_linear_frozen_inputs_and_no_grad(device):
    """Only the inputs that require grad get gradients (a frozen lm_head skips its GEMM); under no_grad
    the loss is the same."""
    hidden, weight, bias, labels = make_inputs(device)
    weight.requires_grad_(False)
    check_flce(hidden, weight, bias, labels, leaves=[hidden, bias], label_smoothing=0.1)
    hidden.requires_grad_(False)
    weight.requires_grad_(True)
    check_flce(hidden, weight, None, labels, leaves=[weight], reduction="none")
    with torch.no_grad():
        a = fused_linear_cross_entropy(hidden, weight, labels, bias=bias, chunk_size=CHUNK)
    b = fused_linear_cross_entropy(hidden, weight, labels, bias=bias, chunk_size=CHUNK)
    assert a.grad_fn is None and torch.equal(a, b.detach())


def test_fused_linear_none_sum_matches_sum(device):
    """reduction="none" followed by .sum() (a stride-0 grad_output) equals reduction="sum"."""
    hidden, weight, bias, labels = make_inputs(device)
    options = dict(label_smoothing=0.1, softcap=2.0, bias=bias, chunk_size=CHUNK)
    none = fused_linear_cross_entropy(hidden, weight, labels, reduction="none", **options)
    a = torch.autograd.grad(none.sum(), (hidden, weight, bias))
    b = torch.autograd.grad(fused_linear_cross_entropy(hidden, weight, labels, reduction="sum", **options),
                            (hidden, weight, bias))
    for x, y in zip(a, b):
        assert rel_err(x, y.double()) < 1e-6


def test_default_chunk_size():
    """The most of Liger's rule (logits chunk ~ hidden), MIN_CHUNK, and 1 GiB of logits or N / 4 rows;
    never above N."""
    assert ce.default_chunk_size(8192, 4096, 128256) == 2048                 # N / 4; Liger's rule gives 256
    assert ce.default_chunk_size(32768, 2048, 128256) == 4096                # 1 GiB of bf16 logits
    assert ce.default_chunk_size(32768, 2048, 128256, 4) == 2048             # fp32 logits: half the rows
    assert ce.default_chunk_size(65536, 4096, 256000) == 2048                # 1 GiB; Liger's rule gives 1024
    assert ce.default_chunk_size(1 << 17, 8192, 32000) == 32768              # Liger's rule
    assert ce.default_chunk_size(3000, 1024, 2_000_000) == 1024              # MIN_CHUNK
    assert ce.default_chunk_size(37, 24, 131) == 37
    assert ce.default_chunk_size(1, 5, 7) == 1


def test_module_matches_functional(device):
    hidden, weight, bias, labels = make_inputs(device)
    loss_fn = FusedLinearCrossEntropyLoss(label_smoothing=0.1, softcap=3.0)
    assert "softcap=3.0" in repr(loss_fn) and not list(loss_fn.parameters())
    a = loss_fn(hidden, weight, labels, bias)
    b = fused_linear_cross_entropy(hidden, weight, labels, label_smoothing=0.1, softcap=3.0, bias=bias)
    assert torch.equal(a, b)
    ref = fused_linear_cross_entropy_ref(hidden.double(), weight.double(), labels, label_smoothing=0.1,
                                         softcap=3.0, bias=bias.double())
    assert_close("module loss", a.detach(), ref.detach(), REL[F32])


def test_second_backward_raises(device):
    """The saved gradients are scaled in place by the backward: a second backward through the same graph
    raises autograd's in-place error instead of returning doubly scaled gradients."""
    hidden, weight, bias, labels = make_inputs(device)
    loss = fused_linear_cross_entropy(hidden, weight, labels, bias=bias)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="inplace"):
        loss.backward()


# ----------------------------------------------------------------------------------------------------
# cross_entropy on logits (same kernel)
# ----------------------------------------------------------------------------------------------------

CE_CASES = [(r, eps, cap, F32) for r in ("mean", "sum", "none") for eps, cap in OPTIONS] + [
    ("mean", 0.0, None, F16), ("none", 0.25, 2.0, F16), ("sum", 0.1, None, F16)]


@pytest.mark.parametrize("reduction, label_smoothing, softcap, dtype", CE_CASES,
                         ids=[f"{r}-{eps}-{cap}-{str(d)[6:]}" for r, eps, cap, d in CE_CASES])
def test_cross_entropy(reduction, label_smoothing, softcap, dtype, device):
    """(batch, seqlen, V) logits, a strided view (rows padded to V + 9), ignored rows."""
    base = (torch.randn(2, 7, V + 9, device=device) * 4).to(dtype)
    leaf = base.requires_grad_(True)
    logits = leaf[..., :V]
    labels = torch.randint(0, V, (2, 7), device=device)
    labels[0, :4] = -100
    out = cross_entropy(logits, labels, reduction=reduction, label_smoothing=label_smoothing, softcap=softcap)
    assert out.dtype == F32 and out.shape == (labels.shape if reduction == "none" else ())
    dout = torch.rand_like(out) + 0.5
    (grad,) = torch.autograd.grad(out, leaf, dout)
    leaf64 = leaf.detach().double().requires_grad_(True)
    ref = cross_entropy_ref(leaf64[..., :V], labels, reduction=reduction, label_smoothing=label_smoothing,
                            softcap=softcap)
    (ref_grad,) = torch.autograd.grad(ref, leaf64, dout.double())
    assert_close("loss", out.detach(), ref.detach(), REL[dtype])
    assert grad.dtype == dtype
    assert_close("grad", grad, ref_grad, REL[dtype])


def test_reference_is_torch_cross_entropy():
    """The textbook reference equals F.cross_entropy (which the fused tests use directly)."""
    z = torch.randn(4, 7, 11, dtype=torch.float64)
    y = torch.randint(0, 11, (4, 7))
    y[1] = -100
    for reduction in ("mean", "sum", "none"):
        for eps in (0.0, 0.3):
            ref = F.cross_entropy(z.reshape(-1, 11), y.reshape(-1), reduction=reduction, label_smoothing=eps)
            got = cross_entropy_ref(z, y, reduction=reduction, label_smoothing=eps)
            assert torch.allclose(got.reshape(ref.shape), ref, rtol=1e-12, atol=1e-12)


def test_kernel_writes_every_output_and_poisons_bad_labels(device):
    """NaN-filled loss, lse and grad buffers are fully overwritten (ignored rows: loss 0, grad 0); a label
    outside [0, V) that is not ignore_index gives a nan loss and a nan gradient row (the path
    torch.compile takes, where the host check is skipped)."""
    logits = torch.randn(6, V, device=device)
    labels = torch.tensor([0, V - 1, -100, V, -5, 17], device=device)
    nan = float("nan")
    loss, lse = torch.full((6,), nan, device=device), torch.full((6,), nan, device=device)
    grad = torch.full_like(logits, nan)
    cross_entropy_rows(logits, labels, ignore_index=-100, label_smoothing=0.0, softcap=0.0, loss=loss,
                       lse=lse, grad=grad)
    good = torch.tensor([0, 1, 5])
    ref = F.cross_entropy(logits[good].double(), labels[good], reduction="none")
    assert_close("loss", loss[good], ref, REL[F32])
    assert loss[2] == 0 and torch.equal(grad[2], torch.zeros(V, device=device))
    assert loss[3:5].isnan().all() and grad[3:5].isnan().all()
    ref_grad = torch.softmax(logits[good].double(), -1) - F.one_hot(labels[good], V).double()
    assert_close("grad", grad[good], ref_grad, REL[F32])
    assert_close("lse", lse[good], torch.logsumexp(logits[good].double(), -1), REL[F32])


# ----------------------------------------------------------------------------------------------------
# Errors and torch.compile
# ----------------------------------------------------------------------------------------------------

def test_bad_labels_raise(device):
    hidden, weight, bias, labels = make_inputs(device)
    for value in (V, -1, 10**12):
        bad = labels.clone()
        bad[7] = value
        with pytest.raises(ValueError, match=rf"labels contains {value}, outside \[0, {V}\)"):
            fused_linear_cross_entropy(hidden, weight, bad)
        with pytest.raises(ValueError, match=rf"labels contains {value}"):
            cross_entropy(torch.randn(N, V, device=device), bad)


def test_argument_errors(device):
    hidden, weight, bias, labels = make_inputs(device)
    flce = fused_linear_cross_entropy
    cases = [
        (lambda: flce(hidden, weight[:, :5], labels), ValueError, r"weight has shape \(131, 5\).*hidden size 24"),
        (lambda: flce(hidden, weight, labels, bias=bias[:7]), ValueError, r"bias has shape \(7,\); expected \(131,\)"),
        (lambda: flce(hidden, weight, labels[:5]), ValueError, r"labels has shape \(5,\).*37 rows"),
        (lambda: flce(hidden, weight.half(), labels), TypeError, "weight has dtype torch.float16"),
        (lambda: flce(hidden, weight, labels.float()), TypeError, "labels has dtype torch.float32"),
        (lambda: flce(hidden[0], weight, labels), ValueError, "hidden must have 2 or 3 dimensions"),
        (lambda: flce(hidden, weight, labels, reduction="avg"), ValueError, "reduction is 'avg'"),
        (lambda: flce(hidden, weight, labels, label_smoothing=1.5), ValueError, "label_smoothing is 1.5"),
        (lambda: flce(hidden, weight, labels, softcap=-1.0), ValueError, "softcap is -1.0"),
        (lambda: flce(hidden, weight, labels, ignore_index=1.0), TypeError, "ignore_index is 1.0"),
        (lambda: flce(hidden, weight, labels, chunk_size=0), ValueError, "chunk_size is 0"),
        (lambda: flce(hidden, weight, labels.tolist()), TypeError, "labels must be a torch.Tensor"),
        (lambda: cross_entropy(torch.randn(5, 0, device=device), labels[:5]), ValueError, "logits has shape"),
        (lambda: cross_entropy(torch.randn(5, 7, device=device), labels), ValueError, r"labels has shape \(37,\)"),
    ]
    for fn, exc, match in cases:
        with pytest.raises(exc, match=match):
            fn()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_torch_compile_fullgraph_small(reduction, device):
    """fullgraph=True (a graph break raises) over both ops, forward and backward: the compiled graph
    calls the same custom ops, so results are bit-identical to eager."""
    hidden, weight, bias, labels = make_inputs(device, n=11)
    logits = torch.randn(11, V, device=device, requires_grad=True)

    def fn(h, w, b, z):
        a = fused_linear_cross_entropy(h, w, labels, reduction=reduction, label_smoothing=0.1, softcap=3.0,
                                       bias=b, chunk_size=4)
        c = cross_entropy(z, labels, reduction=reduction, softcap=3.0)
        return (a * 2 + c).sum()

    results = []
    for f in (fn, torch.compile(fn, fullgraph=True, backend="aot_eager")):
        loss = f(hidden, weight, bias, logits)
        results.append((loss, *torch.autograd.grad(loss, (hidden, weight, bias, logits))))
    for name, eager, compiled in zip(("loss", "dh", "dw", "db", "dz"), *results):
        assert torch.isfinite(compiled).all(), name
        assert torch.equal(compiled, eager), f"{name}: compiled differs from eager"


def test_opcheck(device):
    """torch.library.opcheck: schema, fake (meta) kernels and autograd registration are consistent."""
    hidden, weight, bias, labels = make_inputs(device, n=5, h=8, v=37)
    for reduction in ("mean", "none"):
        torch.library.opcheck(torch.ops.flashfuse.fused_linear_cross_entropy.default,
                              (hidden, weight, labels, bias, -100, reduction, 0.1, 3.0, 2, True, True, True))
        torch.library.opcheck(torch.ops.flashfuse.cross_entropy.default,
                              (torch.randn(5, 37, device=device, requires_grad=True), labels, -100, reduction,
                               0.1, 0.0))
