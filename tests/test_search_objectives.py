"""Objectives and metrics: PSNR/SSIM values, LPIPS backbone handling (never downloads), input checks."""
import io
import os
import urllib.error
import urllib.request
import warnings

import numpy as np
import pytest
import torch

from gcache.core.errors import GCacheError
from gcache.search.infra import objectives as ob


def _pair(b=3, c=3, s=32, noise=0.05, seed=0):
    g = torch.Generator().manual_seed(seed)
    ref = torch.rand(b, c, s, s, generator=g)
    test = (ref + noise * torch.randn(b, c, s, s, generator=g)).clamp(0, 1)
    return test, ref


def test_psnr_known_value_and_identical_images():
    ref = torch.zeros(2, 1, 16, 16)
    test = torch.full_like(ref, 0.1)  # MSE 0.01 → 20 dB
    assert ob.psnr(test, ref) == pytest.approx(20.0, abs=1e-5)
    assert ob.psnr(ref, ref) == ob.PSNR_CAP_DB


def test_ssim_agrees_with_skimage_per_image_and_frames_in_batch():
    from skimage.metrics import structural_similarity
    test, ref = _pair()
    want = np.mean([structural_similarity(t.permute(1, 2, 0).double().numpy(), r.permute(1, 2, 0).double().numpy(),
                                          data_range=1.0, channel_axis=-1, gaussian_weights=True, sigma=1.5,
                                          use_sample_covariance=False) for t, r in zip(test, ref)])
    assert ob.ssim(test, ref) == pytest.approx(want, abs=1e-12)
    assert ob.ssim(ref, ref) == pytest.approx(1.0)
    assert ob.ssim(test[:, :1], ref[:, :1]) < 1.0  # 1-channel works


def test_objective_names_and_losses():
    test, ref = _pair()
    assert ob.make_objective("ssim")(test, ref) == pytest.approx(1 - ob.ssim(test, ref))
    assert ob.make_objective("psnr")(test, ref) == pytest.approx(-ob.psnr(test, ref))
    worse = _pair(noise=0.2)[0]
    for name in ("ssim", "psnr"):
        f = ob.make_objective(name)
        assert f(ref, ref) < f(test, ref) < f(worse, ref)
    with pytest.raises(GCacheError, match="Unknown objective"):
        ob.make_objective("mse")


@pytest.mark.parametrize("bad", ["range", "shape", "nan", "small"])
def test_bad_images_are_refused(bad):
    test, ref = _pair()
    if bad == "range":
        test = test * 2 - 1
    elif bad == "shape":
        test = test[:, :, :16]
    elif bad == "nan":
        test[0, 0, 0, 0] = float("nan")
    else:
        test, ref = test[..., :8, :8], ref[..., :8, :8]
    with pytest.raises(GCacheError):
        ob.make_objective("ssim")(test, ref)


class FakeResponse(io.BytesIO):
    """What urlopen returns, serving bytes from memory (tests never touch the network)."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.headers = {"Content-Length": str(len(data))}


def _offline(*a, **k):
    raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")


def test_offline_backbone_download_names_file_folder_and_alternatives(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", _offline)
    with pytest.raises(ob.LPIPSUnavailable) as e:
        ob.make_objective("lpips_ssim")
    msg = str(e.value)
    assert "alexnet-owt-7be5be79.pth" in msg and os.path.join(str(tmp_path), "checkpoints") in msg
    assert "offline" in msg and "233 MB" in msg and "download.pytorch.org" in msg and "'ssim'" in msg
    assert isinstance(e.value, GCacheError) and os.listdir(tmp_path / "checkpoints") == []  # no partial file


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_backbone_is_downloaded_on_first_use_and_checked(tmp_path, monkeypatch, caplog):
    """A stand-in AlexNet file (random weights) served from memory: downloaded once, hash-checked, loaded."""
    import hashlib

    import torchvision
    buf = io.BytesIO()
    torch.save(torchvision.models.alexnet(weights=None).state_dict(), buf)
    data = buf.getvalue()
    calls = []

    def serve(url, timeout):
        calls.append(url)
        return FakeResponse(data)
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", serve)
    monkeypatch.setattr(ob, "ALEXNET_SHA256_PREFIX", hashlib.sha256(data).hexdigest()[:8])
    with caplog.at_level("INFO", logger="gcache"):
        f = ob.make_objective("lpips_ssim")
    assert calls == ["https://download.pytorch.org/models/alexnet-owt-7be5be79.pth"]
    assert (tmp_path / "checkpoints" / ob.ALEXNET_FILE).read_bytes() == data
    assert "downloading" in caplog.text and "checked" in caplog.text
    x = torch.rand(1, 3, 64, 64)
    assert f(x, x) == pytest.approx(0.0, abs=1e-6)
    ob._LPIPS_NETS.clear()
    ob.make_objective("lpips_ssim")  # the second use finds the file: no second download
    assert len(calls) == 1


def test_downloaded_file_with_wrong_hash_is_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: FakeResponse(b"an error page, not weights"))
    with pytest.raises(ob.LPIPSUnavailable, match="sha256"):
        ob.make_objective("lpips_ssim")
    assert os.listdir(tmp_path / "checkpoints") == []


def test_backbone_with_wrong_hash_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))
    os.makedirs(tmp_path / "checkpoints")
    (tmp_path / "checkpoints" / ob.ALEXNET_FILE).write_bytes(b"not alexnet")
    with pytest.raises(ob.LPIPSUnavailable, match="sha256"):
        ob.make_objective("lpips_ssim")


@pytest.mark.filterwarnings("ignore::UserWarning")  # torchvision's notes on lpips' `pretrained=` argument
def test_backbone_loader_maps_torchvision_alexnet_exactly(tmp_path):
    """Random torchvision AlexNet weights (NOT LPIPS values): our loader must equal lpips' own wiring."""
    import lpips
    import torchvision
    torch.manual_seed(0)
    alex = torchvision.models.alexnet(weights=None)
    path = str(tmp_path / "alex.pth")
    torch.save(alex.state_dict(), path)
    ours = ob.load_lpips(backbone_path=path, verify=False)
    theirs = lpips.LPIPS(net="alex", pnet_rand=True, verbose=False)
    for name, mod in theirs.net.named_children():
        for idx, layer in mod.named_children():
            if hasattr(layer, "weight"):
                layer.weight.data.copy_(alex.features[int(idx)].weight)
                layer.bias.data.copy_(alex.features[int(idx)].bias)
    test, ref = _pair(s=64)
    with torch.no_grad():
        want = float(theirs(test, ref, normalize=True).mean())
    assert ob.lpips_distance(test, ref, ours) == pytest.approx(want, abs=1e-7)


def test_random_backbone_objective_is_labelled_and_handles_tiny_grey_images():
    f = ob.make_objective("lpips_ssim", random_backbone_for_tests=True)
    assert "NOT LPIPS" in f.name
    test, ref = _pair(c=1, s=16)
    assert f(ref, ref) == pytest.approx(0.0, abs=1e-6)
    assert f(test, ref) > 0


@pytest.mark.skipif(not ob.lpips_available(), reason=f"LPIPS backbone {ob.alexnet_path()} is not present (no internet "
                    "here; put torchvision's alexnet-owt-7be5be79.pth there to run this test)")
def test_real_lpips_orders_distortions():
    f = ob.make_objective("lpips_ssim")
    test, ref = _pair(s=64, noise=0.05)
    worse = _pair(s=64, noise=0.3)[0]
    assert f(ref, ref) == pytest.approx(0.0, abs=1e-6) and f(test, ref) < f(worse, ref)


def test_lpips_reads_every_pth_with_weights_only_and_gets_the_papers_lin_layers(monkeypatch):
    import lpips
    import torch

    from gcache.search.infra import objectives as ob
    seen = []
    real_load = torch.load

    def load(*args, **kwargs):
        seen.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", load)
    monkeypatch.setattr(ob, "_LPIPS_NETS", {})
    net = ob.load_lpips(random_backbone_for_tests=True)
    assert seen == [True]  # the lin layers; lpips' own torch.load (torch's default) is never reached
    monkeypatch.setattr(torch, "load", real_load)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        theirs = lpips.LPIPS(net="alex", pretrained=True, pnet_rand=True, verbose=False)
    ours = {k: v for k, v in net.state_dict().items() if k.startswith("lin")}
    assert ours and all(torch.equal(v, theirs.state_dict()[k]) for k, v in ours.items())
