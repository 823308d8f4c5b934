"""The two trained tiny models (comfy_models/): ComfyUI loads them as a user's Flux / Wan, and they learned.

"Learned": on a held-out batch (data seeds training never drew, fixed noise levels spread over the schedule), the
trained model's rectified-flow loss is at most half that of the same config at its initialisation (the model the
training started from, seed 0). A few seconds on one core.
"""
from __future__ import annotations

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import torch  # noqa: E402

from gcache.comfy_models import data  # noqa: E402
from gcache.comfy_models.families import FAMILIES, build, comfyui_version, conds, heldout_loss, load, velocity_loss  # noqa: E402

EXPECTED = {"flux": ("FluxSchnell", "comfy.ldm.flux.model.Flux"), "wan": ("WAN21_T2V", "comfy.ldm.wan.model.WanModel")}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def trained(request):
    torch.set_num_threads(1)
    return load(FAMILIES[request.param])


def test_loaded_as_comfyui_loads_the_family(trained):
    cls, net = EXPECTED[trained.family.name]
    m = trained.patcher.model
    assert type(m.model_config).__name__ == cls
    assert f"{type(m.diffusion_model).__module__}.{type(m.diffusion_model).__name__}" == net
    old_flux = trained.family.name == "flux" and comfyui_version().startswith("0.3.")
    # 0.3.64's detection hard-codes Flux's full widths (docstring of comfy_models/families.py); elsewhere the loader
    if not old_flux:
        assert trained.path == "comfy.sd.load_diffusion_model"
    else:
        assert trained.path.startswith("model_config_from_unet_config") and "hidden_size" in trained.path
    assert m.diffusion_model.img_in.weight.shape[0] == 128 if trained.family.name == "flux" else \
        m.diffusion_model.dim == 128


def test_trained_loss_is_at_most_half_the_untrained(trained):
    fam = trained.family
    untrained = heldout_loss(build(fam, seed=0), fam)
    loss = heldout_loss(trained.patcher, fam)
    print(f"{fam.name}: held-out loss trained {loss:.4f}, untrained {untrained:.4f}, ratio {loss / untrained:.3f}")
    assert loss <= 0.5 * untrained


def test_prompts_matter(trained):
    """The class context lowers the loss against the empty prompt at the same noise: the model uses the prompt."""
    fam = trained.family
    torch.manual_seed(0)
    pixels, labels = fam.make(32, 10 ** 9 + 2)
    x0, noise = data.encode(pixels), torch.randn(32, *fam.latent_shape)
    u = torch.full((32,), 0.8)  # mostly noise: where the prompt decides what is drawn
    with torch.no_grad():
        cond = velocity_loss(trained.patcher, fam, x0, labels, u, noise).mean()
        empty = velocity_loss(trained.patcher, fam, x0, torch.full_like(labels, -1), u, noise).mean()
    assert cond < empty


def test_the_loss_is_comfyuis_denoising_error(trained):
    """Oracle: velocity_loss (the diffusion model called as the sampler calls it) equals the error of ComfyUI's own
    BaseModel.apply_model (denoised x0) scaled back to velocity, (x_t - denoised) / sigma."""
    fam = trained.family
    m = trained.patcher.model
    pixels, labels = fam.make(4, 10 ** 9 + 3)
    x0 = data.encode(pixels)
    g = torch.Generator().manual_seed(5)
    noise, u = torch.randn(x0.shape, generator=g), torch.tensor([0.2, 0.4, 0.6, 0.9])
    sigma = m.model_sampling.sigma(u * getattr(m.model_sampling, "multiplier", 1.0))
    s = sigma.reshape(-1, *[1] * (x0.dim() - 1))
    xt = (1 - s) * x0 + s * noise
    ctx, extra = conds(fam, labels)
    with torch.no_grad():
        denoised = m.apply_model(xt, sigma, c_crossattn=ctx, **extra)
        ours = velocity_loss(trained.patcher, fam, x0, labels, u, noise)
    theirs = (((xt - denoised) / s - (noise - x0)) ** 2).flatten(1).mean(1)
    torch.testing.assert_close(ours, theirs, rtol=1e-3, atol=1e-4)
