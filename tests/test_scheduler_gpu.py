"""FusedScheduler, GPU tier: 10-step loops over fp16 (and fp32) 2x4x64x64 latents equal to diffusers' steps for
every configuration of the CPU tier, a 30-step loop captured in a CUDA graph equal to the eager loop (no host
sync anywhere in the loop: capture would fail), and torch.compile(fullgraph=True)."""

import pytest
import torch
from diffusers import DDIMScheduler, DDPMScheduler, EulerDiscreteScheduler

from flashfuse.ops.scheduler import FusedScheduler
from test_scheduler import CONFIGS, TOL, fake_model, poison, rel_err, run_loops  # noqa: F401  (poison: autouse)

pytestmark = pytest.mark.gpu

F32, F16 = torch.float32, torch.float16
LATENTS = (2, 4, 64, 64)  # SD 1.5 at 512 px


@pytest.mark.parametrize("dtype", [F16, F32])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_loop_matches_diffusers_gpu(name, dtype):
    _, _, errors = run_loops(name, dtype, "cuda", n_steps=10, shape=LATENTS)
    assert max(errors) < TOL[dtype], f"per-step rel errors {errors}"


def _schedulers():
    return [("ddpm", DDPMScheduler(), {}), ("ddim-eta1", DDIMScheduler(), dict(eta=1.0)),
            ("euler", EulerDiscreteScheduler(), {})]


@pytest.mark.parametrize("case", range(3), ids=["ddpm", "ddim-eta1", "euler"])
def test_cuda_graph_30_steps(case):
    """The whole 30-step loop (scale_model_input, the model, the step, the counter increment) captured as
    one CUDA graph gives exactly the eager loop's latents."""
    name, scheduler, kwargs = _schedulers()[case]
    scheduler.set_timesteps(30, device="cuda")
    fused = FusedScheduler(scheduler, **kwargs)
    x0 = torch.randn(LATENTS, device="cuda", dtype=F16) * fused.init_noise_sigma
    noises = torch.randn((30,) + LATENTS, device="cuda", dtype=F16)  # pre-drawn: one per step

    def loop(latents, i):
        for k in range(fused.num_steps):
            out = fake_model(fused.scale_model_input(latents, i), fused.timestep(i)).to(F16)
            latents = fused.step(out, i, latents, noises[k] if fused.stochastic else None)
            i += 1
        return latents

    eager = loop(x0.clone(), fused.new_step_index())            # also compiles the kernels before capture
    static_x, static_i = x0.clone(), fused.new_step_index()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        loop(static_x.clone(), fused.new_step_index())           # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(stream)
    static_i.zero_()
    with torch.cuda.graph(graph):
        static_out = loop(static_x, static_i)
    for _ in range(2):                                          # replays are repeatable: reset the counter
        static_i.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_out, eager), name
        assert int(static_i) == 30
    if name == "ddpm":
        return  # DDPM draws its noise inside diffusers' step: its loop equality is test_loop_matches_diffusers_gpu
    theirs = x0.clone()                                         # the eager loop is diffusers' (fp16, 30 steps)
    for k, t in enumerate(scheduler.timesteps):
        out = fake_model(scheduler.scale_model_input(theirs, t), t).to(F16)
        extra = dict(eta=1.0, variance_noise=noises[k]) if name == "ddim-eta1" else {}
        theirs = scheduler.step(out, t, theirs, **extra).prev_sample
    assert rel_err(eager, theirs) < 2 * TOL[F16]


def test_compile_fullgraph_gpu():
    """Two steps under torch.compile(fullgraph=True): the step is one opaque op, bitwise equal to eager."""
    scheduler = DDIMScheduler()
    scheduler.set_timesteps(10, device="cuda")
    fused = FusedScheduler(scheduler, eta=1.0)
    x, m, z = (torch.randn(LATENTS, device="cuda", dtype=F16) for _ in range(3))
    i = fused.new_step_index(3)

    def two_steps(x, m, z, i):
        x = fused.step(m, i, x, z)
        return fused.step(m * 0.5, i + 1, x, z)

    compiled = torch.compile(two_steps, fullgraph=True)
    assert torch.equal(compiled(x, m, z, i), two_steps(x, m, z, i))
