"""The shipped reference DiT: loads from safetensors, is small, and draws digits a classifier recognizes."""
import os

import numpy as np
import torch
import torch.nn.functional as F

from gcache.reference_model.model import WEIGHTS, load_training_info
from gcache.reference_model.sampler import sample, to_unit


def test_weights_are_small_safetensors():
    assert WEIGHTS.endswith(".safetensors") and os.path.getsize(WEIGHTS) < 4 * 2**20
    info = load_training_info()
    assert int(info["train_steps"]) > 0 and "digits" in info["data"]


def test_samples_are_recognizable_digits(reference_model):
    """A logistic-regression digit classifier (trained on the real 8×8 digits) reads the requested class."""
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression
    d = load_digits()
    clf = LogisticRegression(max_iter=2000).fit(d.data / 16.0, d.target)
    labels = [i % 10 for i in range(30)]
    img = to_unit(sample(reference_model, labels, seeds=list(range(500, 530)), n_steps=20, cfg_scale=3.0))
    small = F.avg_pool2d(img, 2).reshape(len(labels), 64).numpy()
    acc = float(np.mean(clf.predict(small) == np.array(labels)))
    assert acc >= 0.8, f"only {acc:.0%} of samples read as their class"


def test_sampling_is_deterministic_per_seed(reference_model):
    a = sample(reference_model, [7], seeds=[42], n_steps=6)
    b = sample(reference_model, [7, 1], seeds=[42, 43], n_steps=6)
    assert torch.allclose(a[0], b[0], atol=1e-5)
