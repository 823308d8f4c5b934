"""comfy_models/data.py (no ComfyUI): the pixel <-> latent projection is exact, and the data is what it says."""
import torch

from gcache.comfy_models import data


def test_projection_has_orthonormal_columns():
    q = data.projection()
    assert q.shape == (16, 12)
    torch.testing.assert_close(q.T @ q, torch.eye(12), atol=1e-5, rtol=0)


def test_decode_inverts_encode_on_images_and_videos():
    x, _ = data.images(8, 3)
    v, _ = data.videos(2, 3)
    assert data.encode(x).shape == (8, 16, 16, 16) and data.encode(v).shape == (2, 16, data.FRAMES, 16, 16)
    torch.testing.assert_close(data.decode(data.encode(x)), x, atol=1e-5, rtol=0)
    torch.testing.assert_close(data.decode(data.encode(v)), v, atol=1e-5, rtol=0)


def test_encode_is_the_stated_linear_map():
    """Hand check of one latent pixel: gain * Q . (the 2 x 2 RGB patch, channel-major as pixel_unshuffle orders it)."""
    x, _ = data.images(1, 4)
    patch = torch.stack([x[0, c, i, j] for c in range(3) for i in range(2) for j in range(2)])
    torch.testing.assert_close(data.encode(x)[0, :, 0, 0], data.GAIN * data.projection() @ patch)


def test_images_are_seeded_in_range_and_labelled():
    a, la = data.images(12, 9)
    b, lb = data.images(12, 9)
    assert torch.equal(a, b) and torch.equal(la, lb)
    assert a.min() >= -1 and a.max() <= 1
    c, lc = data.images(6, 0, classes=[0, 1, 2, 3, 4, 5])
    assert lc.tolist() == [0, 1, 2, 3, 4, 5]


def test_videos_move():
    v, _ = data.videos(4, 2)
    assert (v[:, :, 0] - v[:, :, -1]).abs().amax(dim=(1, 2, 3)).min() > 0.1  # every clip's shape moved


def test_prompts_are_fixed_and_distinct():
    c1, p1 = data.prompts(3, 4, 8, 5)
    c2, _ = data.prompts(3, 4, 8, 5)
    assert torch.equal(c1, c2) and c1.shape == (4, 4, 8) and p1.shape == (4, 5)
    assert all(not torch.equal(c1[i], c1[j]) for i in range(4) for j in range(i))
