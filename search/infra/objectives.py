"""Outer objectives (paper Appendix A.3) and report metrics on images in [0, 1], shape [B, C, H, W].

Video: put the frames in the batch. 1-channel images are allowed (replicated to RGB for LPIPS).

Objectives (losses, lower is better):
    "lpips_ssim"  LPIPS(AlexNet) + (1 − SSIM)     the paper's default
    "ssim"        1 − SSIM                         needs no downloaded weights
    "psnr"        −PSNR in dB                      needs no downloaded weights

SSIM is scikit-image's (Gaussian window σ = 1.5, data range 1, population covariance, as Wang et al.),
averaged over the batch. PSNR is the mean over images of 10·log10(1 / MSE), capped at 100 dB.

LPIPS uses the lpips package's linear layers (shipped in its wheel) on torchvision's ImageNet AlexNet, which we
load ourselves from torch.hub's cache (torchvision does not check the hash of a file that is already there). On
first use it is downloaded from torchvision's own address with a log line, a progress bar and a sha256 check
(backbone_download.py); offline, the message says where to put the file and offers the 'ssim' / 'psnr' objectives.
"""
from __future__ import annotations

import hashlib
import os
import sys
import warnings
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ...core.errors import GCacheError
from . import backbone_download

OBJECTIVES = ("lpips_ssim", "ssim", "psnr")
ALEXNET_FILE = "alexnet-owt-7be5be79.pth"
ALEXNET_SHA256_PREFIX = "7be5be79"
PSNR_CAP_DB = 100.0
LPIPS_MIN_SIDE = 64  # AlexNet's stride-4 stem and pools need ≥ ~32 px; tiny images are upsampled for LPIPS only


class LPIPSUnavailable(GCacheError):
    """The ImageNet AlexNet backbone that LPIPS needs is not on this machine (or is the wrong file)."""


def alexnet_path() -> str:
    return os.path.join(torch.hub.get_dir(), "checkpoints", ALEXNET_FILE)


def _missing_message(path: str, problem: str) -> str:
    return (f"LPIPS needs torchvision's ImageNet AlexNet weights, {ALEXNET_FILE} (~233 MB from "
            f"https://download.pytorch.org/models/{ALEXNET_FILE}): {problem}. Put that file into the folder "
            f"{os.path.dirname(path)}/ (torch.hub.get_dir()/checkpoints/) and run again, or choose the objective "
            "'ssim' or 'psnr', which need no downloaded weights.")


# ---------------------------------------------------------------------------------------------- input checks
def _check_pair(test: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not (torch.is_tensor(test) and torch.is_tensor(ref)):
        raise GCacheError("Objectives take two image tensors [B, C, H, W] in [0, 1].")
    if test.shape != ref.shape or test.dim() != 4 or test.numel() == 0:
        raise GCacheError(f"Objectives need two image batches of one shape [B, C, H, W]; got {tuple(test.shape)} and "
                          f"{tuple(ref.shape)}. For video, put the frames in the batch.")
    test, ref = test.detach().float(), ref.detach().float()
    if not (torch.isfinite(test).all() and torch.isfinite(ref).all()):
        raise GCacheError("An image holds NaN/Inf values: the sampling run diverged; check the model and the policy.")
    lo, hi = min(test.min().item(), ref.min().item()), max(test.max().item(), ref.max().item())
    if lo < -1e-3 or hi > 1 + 1e-3:
        raise GCacheError(f"Images must lie in [0, 1] (decoded images), got values in [{lo:.3g}, {hi:.3g}].")
    return test.clamp(0, 1), ref.clamp(0, 1)


# ---------------------------------------------------------------------------------------------- metrics
def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over images of PSNR in dB (data range 1), each capped at 100 dB (identical images)."""
    a, b = _check_pair(a, b)
    mse = (a.double() - b.double()).pow(2).flatten(1).mean(1)
    vals = torch.where(mse > 0, 10 * torch.log10(1.0 / mse.clamp_min(1e-300)), torch.full_like(mse, PSNR_CAP_DB))
    return float(vals.clamp(max=PSNR_CAP_DB).mean())


def ssim(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over images of scikit-image's SSIM (Gaussian σ = 1.5, data range 1, channels averaged)."""
    from skimage.metrics import structural_similarity
    a, b = _check_pair(a, b)
    if min(a.shape[-2:]) < 11:
        raise GCacheError("SSIM needs images of at least 11×11 pixels (its Gaussian window), got "
                          f"{tuple(a.shape[-2:])}.")
    an = a.permute(0, 2, 3, 1).cpu().numpy().astype(np.float64)
    bn = b.permute(0, 2, 3, 1).cpu().numpy().astype(np.float64)
    vals = [structural_similarity(x, y, data_range=1.0, channel_axis=-1, gaussian_weights=True, sigma=1.5,
                                  use_sample_covariance=False) for x, y in zip(an, bn)]
    return float(np.mean(vals))


# ---------------------------------------------------------------------------------------------- LPIPS
_LPIPS_NETS: dict = {}


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def ensure_backbone(backbone_path: Optional[str] = None, verify: bool = True, download: bool = True) -> str:
    """The AlexNet backbone's path, once the file is there (downloaded on first use unless `download` is False) and
    its sha256 checked; else LPIPSUnavailable. A command checks this before its work starts, without building LPIPS."""
    path = backbone_path or alexnet_path()
    if not os.path.isfile(path):
        if not download:
            raise LPIPSUnavailable(_missing_message(path, f"{path} does not exist"))
        try:
            backbone_download.download_checked(backbone_download.ALEXNET_URL, path, ALEXNET_SHA256_PREFIX)
        except backbone_download.DownloadFailed as e:
            raise LPIPSUnavailable(_missing_message(path, str(e))) from None
    if verify and not _sha256(path).startswith(ALEXNET_SHA256_PREFIX):
        raise LPIPSUnavailable(_missing_message(
            path, f"{path} is not that file (its sha256 does not start with {ALEXNET_SHA256_PREFIX}); replace it"))
    return path


def load_lpips(device=None, backbone_path: Optional[str] = None, verify: bool = True,
               random_backbone_for_tests: bool = False, download: bool = True) -> torch.nn.Module:
    """lpips.LPIPS(net='alex') built without lpips' download path; the backbone comes from `backbone_path`
    (default: torch.hub's checkpoint folder, downloaded there on first use unless `download` is False).

    `random_backbone_for_tests=True` keeps a random AlexNet: its values are NOT LPIPS (plumbing tests only).
    """
    import lpips
    path = backbone_path or alexnet_path()
    key = (str(device), path, random_backbone_for_tests)
    if key in _LPIPS_NETS:
        return _LPIPS_NETS[key]
    if not random_backbone_for_tests:
        ensure_backbone(path, verify=verify, download=download)
    # pnet_rand=True builds torchvision's AlexNet without weights (no download). The lin layers are the wheel's
    # weights/v0.1/alex.pth, loaded here rather than by lpips (whose torch.load relies on torch's default) so that
    # every .pth we read goes through weights_only=True: tensors only, no code runs.
    with warnings.catch_warnings():  # torchvision's deprecation notes about `pretrained=False`
        warnings.simplefilter("ignore", UserWarning)
        net = lpips.LPIPS(net="alex", pretrained=False, pnet_rand=True, verbose=False)
    lin_path = os.path.join(os.path.dirname(lpips.__file__), "weights", "v0.1", "alex.pth")
    lin = torch.load(lin_path, map_location="cpu", weights_only=True)
    missing, unexpected = net.load_state_dict(lin, strict=False)
    if unexpected or any(k.startswith("lin") and not k.startswith("lins.") for k in missing):  # lins.i = lini
        raise LPIPSUnavailable(f"lpips' own weights {lin_path} do not fit its model (missing {missing[:3]}, "
                               f"unexpected {unexpected[:3]}): reinstall lpips (\"{sys.executable}\" -m pip install "
                               "--force-reinstall lpips)")
    if not random_backbone_for_tests:
        try:
            # torchvision ships this backbone only as a .pth (a pickle in a zip): the one non-safetensors file we
            # read. weights_only=True refuses anything but tensors (no code runs), and the sha256 was checked above.
            sd = torch.load(path, map_location="cpu", weights_only=True)
            features = {k[len("features."):]: v for k, v in sd.items() if k.startswith("features.")}
            # lpips splits AlexNet.features into slices named sliceK.<index in features>.
            mapped = {name: features[name.split(".", 1)[1]] for name in net.net.state_dict()}
            net.net.load_state_dict(mapped, strict=True)
        except (KeyError, RuntimeError, OSError, AttributeError, ValueError) as e:
            raise LPIPSUnavailable(_missing_message(path, f"{path} could not be read as AlexNet weights ({e})")
                                   ) from None
    net = net.eval().requires_grad_(False)
    if device is not None:
        net = net.to(device)
    _LPIPS_NETS[key] = net
    return net


def lpips_distance(a: torch.Tensor, b: torch.Tensor, net: torch.nn.Module) -> float:
    a, b = _check_pair(a, b)
    if a.shape[1] == 1:
        a, b = a.expand(-1, 3, -1, -1), b.expand(-1, 3, -1, -1)
    elif a.shape[1] != 3:
        raise GCacheError(f"LPIPS takes 1- or 3-channel images, got {a.shape[1]} channels.")
    if min(a.shape[-2:]) < LPIPS_MIN_SIDE:
        scale = LPIPS_MIN_SIDE / min(a.shape[-2:])
        size = [max(LPIPS_MIN_SIDE, round(s * scale)) for s in a.shape[-2:]]
        a = F.interpolate(a, size=size, mode="bilinear", align_corners=False)
        b = F.interpolate(b, size=size, mode="bilinear", align_corners=False)
    dev = next(net.parameters()).device
    with torch.no_grad():
        return float(net(a.to(dev), b.to(dev), normalize=True).mean())


# ---------------------------------------------------------------------------------------------- factory
class Objective:
    """A loss callable(test_images, ref_images) -> float, with the name it reports under."""

    def __init__(self, name: str, fn: Callable[[torch.Tensor, torch.Tensor], float], description: str):
        self.name, self._fn, self.description = name, fn, description

    def __call__(self, test: torch.Tensor, ref: torch.Tensor) -> float:
        return float(self._fn(test, ref))

    def __repr__(self) -> str:
        return f"Objective({self.name!r}: {self.description})"


def make_objective(name: str = "lpips_ssim", device=None, random_backbone_for_tests: bool = False) -> Objective:
    """The outer loss by name. For "lpips_ssim" the AlexNet backbone must be present (else LPIPSUnavailable)."""
    if name == "ssim":
        return Objective("ssim", lambda a, b: 1.0 - ssim(a, b), "1 - SSIM")
    if name == "psnr":
        return Objective("psnr", lambda a, b: -psnr(a, b), "-PSNR in dB")
    if name == "lpips_ssim":
        net = load_lpips(device, random_backbone_for_tests=random_backbone_for_tests)
        label = "lpips_ssim[random backbone: NOT LPIPS, tests only]" if random_backbone_for_tests else "lpips_ssim"
        return Objective(label, lambda a, b: lpips_distance(a, b, net) + 1.0 - ssim(a, b), "LPIPS(alex) + 1 - SSIM")
    raise GCacheError(f"Unknown objective {name!r}: choose one of {', '.join(OBJECTIVES)}.")


def lpips_available() -> bool:
    return os.path.isfile(alexnet_path())
