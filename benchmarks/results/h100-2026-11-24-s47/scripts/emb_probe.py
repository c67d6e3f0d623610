"""Session 47: timestep_embedding vs diffusers' get_timestep_embedding on the GPU: elements that differ, max diff."""
import torch
from diffusers.models.embeddings import get_timestep_embedding
from flashfuse.ops.embeddings import timestep_embedding
for dim, flip, shift, dt in [(256, True, 1, torch.int64), (320, True, 0, torch.float32), (1280, False, 1, torch.int64)]:
    t = (torch.rand(4096, device="cuda") * 1000).to(dt)
    a, b = timestep_embedding(t, dim, flip, shift), get_timestep_embedding(t, dim, flip, shift)
    print(f"dim {dim} flip {flip} shift {shift} {dt}: {(a != b).sum().item()} of {a.numel()} differ, max "
          f"{(a - b).abs().max().item():.3e}", flush=True)
