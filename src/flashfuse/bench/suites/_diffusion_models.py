"""The diffusion models of the ``models`` suite: an SD-1.5-shaped UNet2DConditionModel running a classifier-free
guided Euler loop with its scheduler, and a DiT-XL/2-shaped DiTTransformer2DModel denoising step (random init from
configs, nothing downloaded). ``patch=True`` is flashfuse's version: ``patch_diffusers`` on the model and, for the
loop, ``FusedScheduler`` (one kernel per step, device-side step counter) in place of diffusers' ``step``.
"""

from __future__ import annotations

import gc

import torch

# SD-1.5's UNet (runwayml/stable-diffusion-v1-5 unet/config.json) and its Euler scheduler settings.
SD15_UNET = dict(sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
                 block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
                 down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
                 up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3)
UNET_TINY = dict(sample_size=8, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
                 cross_attention_dim=32, attention_head_dim=8, norm_num_groups=8,
                 down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                 up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
EULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
             steps_offset=1, timestep_spacing="leading")
GUIDANCE = 7.5
# DiT-XL/2 at 256x256 (facebook/DiT-XL-2-256 transformer/config.json).
DIT_XL_2 = dict(num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=28,
                sample_size=32, patch_size=2, norm_type="ada_norm_zero", num_embeds_ada_norm=1000)
DIT_TINY = dict(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8, num_layers=2,
                sample_size=8, patch_size=2, norm_type="ada_norm_zero", num_embeds_ada_norm=10)


def build(kind: str, config: dict, dtype: torch.dtype, device: str, patch: bool):
    """The model from seed 0, built in fp32 then cast (every provider starts from the same weights)."""
    from diffusers import DiTTransformer2DModel, UNet2DConditionModel
    gc.collect()
    torch.manual_seed(0)
    with torch.device(device):
        model = (UNet2DConditionModel if kind == "unet" else DiTTransformer2DModel)(**config)
    model = model.to(dtype).eval()
    if patch:
        from flashfuse.integrations import patch_diffusers
        patch_diffusers(model)
    return model


def euler_loop(unet, latents, text, steps: int, fused: bool):
    """A text-to-image loop: CFG over a batch of 2 (unconditional, conditional), Euler steps. Returns the
    final latents."""
    from diffusers import EulerDiscreteScheduler
    scheduler = EulerDiscreteScheduler(**EULER)
    scheduler.set_timesteps(steps, device=latents.device)
    if fused:
        from flashfuse.ops.scheduler import FusedScheduler
        fs = FusedScheduler(scheduler)
        i = fs.new_step_index()
        x = latents * fs.init_noise_sigma
        for _ in range(fs.num_steps):
            eps = unet(fs.scale_model_input(torch.cat([x, x]), i), fs.timestep(i), encoder_hidden_states=text).sample
            uncond, cond = eps.chunk(2)
            x = fs.step(uncond + GUIDANCE * (cond - uncond), i, x)
            i += 1
        return x
    x = latents * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        eps = unet(scheduler.scale_model_input(torch.cat([x, x]), t), t, encoder_hidden_states=text).sample
        uncond, cond = eps.chunk(2)
        x = scheduler.step(uncond + GUIDANCE * (cond - uncond), t, x).prev_sample
    return x


def graphed_euler_loop(unet, text, steps: int, device):
    """flashfuse's loop with each denoising step (CFG batch, UNet, guidance, FusedScheduler step) replayed as
    one CUDA graph; the step counter lives on the device and is bumped between replays. Returns loop(latents)."""
    from diffusers import EulerDiscreteScheduler

    from flashfuse.cuda_graph import cuda_graph
    from flashfuse.ops.scheduler import FusedScheduler
    scheduler = EulerDiscreteScheduler(**EULER)
    scheduler.set_timesteps(steps, device=device)
    fs = FusedScheduler(scheduler)

    def step(x, i):
        eps = unet(fs.scale_model_input(torch.cat([x, x]), i), fs.timestep(i), encoder_hidden_states=text).sample
        uncond, cond = eps.chunk(2)
        return fs.step(uncond + GUIDANCE * (cond - uncond), i, x)

    graphed = cuda_graph(step, clone_outputs=False)    # x is copied into the next replay's input anyway

    def loop(latents):
        i = fs.new_step_index()
        x = latents * fs.init_noise_sigma
        for _ in range(fs.num_steps):
            x = graphed(x, i)
            i += 1
        return x.clone()
    return loop


def dit_step(dit, x, timestep, class_labels):
    return dit(hidden_states=x, timestep=timestep, class_labels=class_labels).sample
