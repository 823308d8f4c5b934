"""The two tiny trained models as ComfyUI models: their configs, their conds, and loading a shipped file.

Imports ComfyUI (lazily: `comfy` must be importable, e.g. COMFYUI_PATH on sys.path, see `use_comfyui`).

- flux: comfy.ldm.flux.model.Flux without guidance embedding (ComfyUI's detection picks supported_models.FluxSchnell:
  ModelSamplingFlux, shift 1.0), width 128 with one 128-wide head on Flux's own RoPE axes (16, 56, 56), 2 double and
  4 single blocks, text width 64, pooled width 32. Images 32 x 32 -> latent 16 x 16 x 16 -> 64 image tokens.
- wan: comfy.ldm.wan.model.WanModel t2v (supported_models.WAN21_T2V: ModelSamplingDiscreteFlow, shift 8), width 128
  (one head: detection sets num_heads = dim // 128), 4 blocks, Wan's 4096-wide text. Video 4 x 32 x 32 -> latent
  16 x 4 x 16 x 16 (4 latent frames) -> 256 tokens.

Loading: ComfyUI 0.33's detection reads every width of both from the weights, so `load` goes through
comfy.sd.load_diffusion_model (the UNETLoader's loader) and checks that what it detected is the file's config.
ComfyUI 0.3.64's detection hard-codes Flux's widths (hidden 3072, text 4096): there `load` takes the config from the
file's metadata and builds it as load_diffusion_model does after detection (comfy.model_detection's
model_config_from_unet_config, get_model, load_model_weights), and says so in `Loaded.path`.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from typing import Callable, Optional

import torch

from . import data

HERE = os.path.dirname(os.path.abspath(__file__))
META_CONFIG, META_TRAINING = "gcache.unet_config", "gcache.training"  # safetensors metadata keys (JSON strings)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    unet_config: dict
    params_class: str  # the params dataclass ("module.Class" under comfy.ldm) whose required fields complete() fills
    classes: tuple
    tokens: int  # prompt tokens
    context_width: int
    pooled_width: int  # 0: no pooled vector
    make: Callable  # data.images / data.videos
    latent_shape: tuple  # one sample's ComfyUI latent (C, [T,] H, W)
    file: str

    @property
    def path(self) -> str:
        return os.path.join(HERE, self.file)

    def prompts(self):
        return data.prompts(len(self.classes), self.tokens, self.context_width, self.pooled_width)


FLUX = Family(
    name="flux",
    unet_config={"image_model": "flux", "in_channels": 16, "out_channels": 16, "patch_size": 2, "vec_in_dim": 32,
                 "context_in_dim": 64, "hidden_size": 128, "mlp_ratio": 4.0, "num_heads": 1, "depth": 2,
                 "depth_single_blocks": 4, "axes_dim": [16, 56, 56], "theta": 10000, "qkv_bias": True,
                 "guidance_embed": False},
    params_class="flux.model.FluxParams", classes=data.IMAGE_CLASSES, tokens=8, context_width=64, pooled_width=32,
    make=data.images, latent_shape=(16, data.SIDE // 2, data.SIDE // 2), file="flux_tiny.safetensors")

WAN = Family(
    name="wan",
    unet_config={"image_model": "wan2.1", "model_type": "t2v", "patch_size": [1, 2, 2], "in_dim": 16, "dim": 128,
                 "ffn_dim": 512, "freq_dim": 256, "out_dim": 16, "num_heads": 1, "num_layers": 4,
                 "window_size": [-1, -1], "qk_norm": True, "cross_attn_norm": True, "eps": 1e-6},
    params_class="", classes=data.VIDEO_CLASSES, tokens=8, context_width=4096, pooled_width=0,
    make=data.videos, latent_shape=(16, data.FRAMES, data.SIDE // 2, data.SIDE // 2), file="wan_tiny.safetensors")

FAMILIES = {"flux": FLUX, "wan": WAN}

# Fields that newer ComfyUI's params dataclasses require, with the value detection gives a plain model of the family.
PLAIN = {"txt_ids_dims": [], "vec_in_dim": None}


def use_comfyui(path: Optional[str] = None) -> str:
    """Put ComfyUI (COMFYUI_PATH) on sys.path, on the CPU unless a GPU is there; returns its folder."""
    path = path or os.environ.get("COMFYUI_PATH")
    if not path or not os.path.isfile(os.path.join(path, "comfy", "model_patcher.py")):
        raise SystemExit(f"COMFYUI_PATH={path!r} is no ComfyUI folder (one with comfy/model_patcher.py): set it")
    if path not in sys.path:
        sys.path.insert(0, path)
    import comfy.cli_args
    comfy.cli_args.args.cpu = not torch.cuda.is_available()
    return path


def comfyui_version() -> str:
    try:
        import comfyui_version
        return comfyui_version.__version__
    except ImportError:
        return "unknown"


def complete(family: Family) -> dict:
    """The family's unet_config plus the fields this ComfyUI's params dataclass requires (tuples as ComfyUI has
    them)."""
    cfg = {k: (tuple(v) if isinstance(v, list) and k in ("patch_size", "window_size") else v)
           for k, v in family.unet_config.items()}
    if family.params_class:
        module, cls = family.params_class.rsplit(".", 1)
        for f in dataclasses.fields(getattr(importlib.import_module("comfy.ldm." + module), cls)):
            if f.name in cfg or f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            if f.name not in PLAIN:
                raise KeyError(f"{family.params_class} requires {f.name!r}, unknown to comfy_models.families.PLAIN")
            cfg[f.name] = PLAIN[f.name]
    return cfg


def _model_config(cfg: dict, sd=None):
    import comfy.model_detection
    mc = comfy.model_detection.model_config_from_unet_config(cfg, sd)
    if mc is None:
        raise RuntimeError(f"no ComfyUI model class matches {cfg}")
    mc.set_inference_dtype(torch.float32, None)
    return mc


def _patcher(base_model):
    import comfy.model_management
    import comfy.model_patcher
    return comfy.model_patcher.ModelPatcher(base_model, load_device=comfy.model_management.get_torch_device(),
                                            offload_device=torch.device("cpu"))


def init_weights(net: torch.nn.Module, seed: int) -> None:
    """ComfyUI builds its layers uninitialised (comfy.ops.disable_weight_init): PyTorch's own initialisation for
    Linear/Conv, ones/zeros for norms, Wan's randn / sqrt(dim) for its modulation tables, and a zero output layer
    (adaLN-zero DiTs start as "predict 0")."""
    torch.manual_seed(seed)
    done = set()
    for mod in net.modules():
        for base in (torch.nn.Linear, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Embedding):
            if isinstance(mod, base):
                base.reset_parameters(mod)
                done.update(id(p) for p in mod.parameters(recurse=False))
    with torch.no_grad():
        for name, p in net.named_parameters():
            if id(p) in done:
                continue
            leaf = name.rsplit(".", 1)[-1]
            if "modulation" in leaf:
                p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
            elif p.dim() == 1 and leaf in ("weight", "scale"):
                p.fill_(1.0)
            elif leaf == "bias":
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape) * 0.02)
        head = net.final_layer.linear if hasattr(net, "final_layer") else net.head.head
        head.weight.zero_()
        head.bias.zero_()


def build(family: Family, seed: int = 0):
    """A freshly initialised model of `family` (ModelPatcher, float32, CPU)."""
    mc = _model_config(complete(family))
    model = mc.get_model({}, device=torch.device("cpu"))
    model.diffusion_model.to(torch.float32)
    init_weights(model.diffusion_model, seed)
    return _patcher(model)


@dataclasses.dataclass
class Loaded:
    patcher: object
    family: Family
    path: str  # how it was loaded: "comfy.sd.load_diffusion_model" or the 0.3.64 fallback
    training: dict


def read_metadata(path: str) -> dict:
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        return dict(f.metadata() or {})


def load(family: Family, path: Optional[str] = None) -> Loaded:
    """Load a trained file as a user's model is loaded (see the module's docstring), float32."""
    import comfy.model_detection
    import comfy.sd
    import comfy.utils
    path = path or family.path
    meta = read_metadata(path)
    want = json.loads(meta[META_CONFIG])
    sd = comfy.utils.load_torch_file(path)
    detected = comfy.model_detection.detect_unet_config(sd, "")
    mismatch = {k: (detected.get(k), v) for k, v in want.items()
                if _plain(detected.get(k)) != _plain(v)} if detected else {"detected": (None, "a model")}
    if not mismatch:
        patcher = comfy.sd.load_diffusion_model(path, model_options={"dtype": torch.float32})
        how = "comfy.sd.load_diffusion_model"
    else:  # 0.3.64's detection hard-codes Flux's full widths: build the file's own config as the loader would
        mc = _model_config(complete(dataclasses.replace(family, unet_config=want)), sd)
        model = mc.get_model(sd, "")
        model.diffusion_model.to(torch.float32)
        model.load_model_weights(dict(sd), "")
        patcher = _patcher(model)
        how = ("model_config_from_unet_config(file metadata) + load_model_weights: this ComfyUI's detection reads "
               f"{ {k: v[0] for k, v in mismatch.items()} } instead of the file's "
               f"{ {k: v[1] for k, v in mismatch.items()} }")
    check_weights(patcher, sd, path)
    return Loaded(patcher, family, how, json.loads(meta.get(META_TRAINING, "{}")))


def _plain(v):
    return list(v) if isinstance(v, tuple) else v


def check_weights(patcher, sd: dict, path: str) -> None:
    """Every weight of the file landed in the model unchanged (load_state_dict(strict=False) only logs)."""
    sd = patcher.model.model_config.process_unet_state_dict(dict(sd))  # the file's names as this ComfyUI names them
    own = patcher.model.diffusion_model.state_dict()
    missing = sorted(set(own) ^ set(sd))
    if missing:
        raise RuntimeError(f"{path}: keys that the model and the file do not share: {missing[:5]}")
    for k, v in sd.items():
        if not torch.equal(own[k].float().cpu(), v.float()):
            raise RuntimeError(f"{path}: weight {k} differs after loading")


def file_key(family: Family, key: str) -> str:
    """A weight's name in the file: Flux's QK-norm scales as Black Forest Labs' files name them (`…_norm.scale`),
    which every ComfyUI reads (0.33 renames them `…_norm.weight` on loading; 0.3.64 names them so itself)."""
    if family.name == "flux" and key.endswith("_norm.weight"):
        return key[:-len("weight")] + "scale"
    return key


def save(patcher, family: Family, path: str, training: dict) -> None:
    import comfy.utils
    sd = {file_key(family, k): v.detach().contiguous().cpu()
          for k, v in patcher.model.diffusion_model.state_dict().items()}
    comfy.utils.save_torch_file(sd, path, metadata={META_CONFIG: json.dumps(family.unet_config),
                                                    META_TRAINING: json.dumps(training)})


# ------------------------------------------------------------------------------------------------ conds and loss
def conds(family: Family, labels, device=None):
    """(context (B, tokens, width), extra kwargs of the diffusion model) for class labels; label -1 (or
    len(classes)) is the empty prompt."""
    ctx, pooled = family.prompts()
    idx = torch.as_tensor(labels) % (len(family.classes) + 1)
    extra = {"y": pooled[idx].to(device)} if pooled is not None else {}
    return ctx[idx].to(device), extra


def comfy_cond(family: Family, label: int):
    """ComfyUI's CONDITIONING ([[tensor, {extras}]]) for one class label (-1: the empty prompt)."""
    ctx, pooled = family.prompts()
    extras = {"pooled_output": pooled[label][None]} if pooled is not None else {}
    return [[ctx[label][None], extras]]


def velocity_loss(patcher, family: Family, x0: torch.Tensor, labels, u: torch.Tensor, noise: torch.Tensor):
    """Rectified-flow loss as ComfyUI's sampler drives the model: sigma = model_sampling.sigma(u * multiplier),
    x_t = (1 - sigma) x0 + sigma n (CONST), the model called with model_sampling.timestep(sigma); target n - x0.
    Per-sample mean squared error (B,)."""
    model = patcher.model
    ms = model.model_sampling
    sigma = ms.sigma(u * getattr(ms, "multiplier", 1.0))
    s = sigma.reshape(-1, *[1] * (x0.dim() - 1))
    xt = (1 - s) * x0 + s * noise
    ctx, extra = conds(family, labels)
    out = model.diffusion_model(ms.calculate_input(sigma, xt), ms.timestep(sigma), ctx, **extra)
    return ((out - (noise - x0)) ** 2).flatten(1).mean(1)


def heldout_loss(patcher, family: Family, n: int = 32, seed: int = 10 ** 9 + 1) -> float:
    """Mean velocity loss on held-out samples (data seed unseen in training), fixed noise levels and noise."""
    g = torch.Generator().manual_seed(seed)
    pixels, labels = family.make(n, seed)
    x0 = data.encode(pixels)
    u = (torch.arange(n, dtype=torch.float32) + 0.5) / n  # evenly over the schedule
    noise = torch.randn(x0.shape, generator=g)
    with torch.no_grad():
        return float(velocity_loss(patcher, family, x0, labels, u, noise).mean())
