"""Brute-force references for every statistic a profile records (core/profile.py, core/fit_stats.py).

Plain float64 loops over the residuals exactly as the recorder was given them (in their own dtype), written from
the definitions in the docstrings, not from the recorder's code: no chunking, no folds by reshape, no in-place
arithmetic. Tests compare the recorder with these; a tolerance only reflects float32 accumulation.
"""
from __future__ import annotations

import math

import numpy as np

EPS32 = float(np.finfo(np.float32).eps)


def stride_of(numel: int, last_dim: int, max_elems) -> int:
    """The documented sampling rule: the smallest s with ⌈numel / s⌉ ≤ max_elems (s ≥ ⌈numel / max_elems⌉) that
    is coprime with the channel count; 1 when the residual fits."""
    if not max_elems or numel <= max_elems:
        return 1
    s = 1
    while s * max_elems < numel or math.gcd(s, last_dim) != 1:
        s += 1
    return s


def sampled(t, stride: int) -> np.ndarray:
    """Every stride-th element of the flattened tensor (element 0 first), as float64 values of the stored dtype."""
    flat = t.detach().reshape(-1).double().tolist()
    return np.array([flat[k] for k in range(0, len(flat), stride)], dtype=np.float64)


def folds(x: np.ndarray) -> list[np.ndarray]:
    """Even and odd elements of the first 2·⌊m/2⌋ (an odd last element belongs to neither)."""
    m = 2 * (len(x) // 2)
    return [np.array([x[k] for k in range(0, m, 2)]), np.array([x[k] for k in range(1, m, 2)])]


def branch(hs: list[np.ndarray], ds: list[np.ndarray], times, forecast: bool) -> dict:
    """The statistics of one branch whose steps 0..N−1 were recorded in order (h_j, δ_j sampled, float64).

    Also the scales the float32 tolerance is measured against (sums of the magnitudes that are rounded)."""
    n = len(ds)
    out = {"E": np.zeros((n, n)), "norms": np.zeros(n), "rel_h": np.zeros(n), "rel_delta": np.zeros(n)}
    for i in range(n):
        out["norms"][i] = np.mean(np.abs(ds[i]))
        for j in range(n):
            out["E"][i, j] = np.mean(np.abs(ds[i] - ds[j]))
    for j in range(1, n):
        out["rel_h"][j] = np.mean(np.abs(hs[j] - hs[j - 1])) / max(np.mean(np.abs(hs[j - 1])), 1e-12)
        out["rel_delta"][j] = out["E"][j - 1, j] / max(out["norms"][j - 1], 1e-12)
    if not forecast:
        return out
    t = [float(v) for v in times]
    e1, e1_scale = np.zeros((n, n, n)), np.zeros((n, n, n))
    sq, gram, gram_scale = np.zeros((n, n, 2)), np.zeros((n, n, 2)), np.zeros((n, n, 2))
    cross, cross_scale = np.zeros((n, n, n, 2)), np.zeros((n, n, n, 2))
    fd = [folds(d) for d in ds]
    for p in range(n):
        for i in range(p + 1, n):
            for j in range(i + 1, n):
                c = (t[j] - t[i]) / (t[i] - t[p])
                forecast_j = ds[i] + c * (ds[i] - ds[p])
                e1[p, i, j] = np.mean(np.abs(forecast_j - ds[j]))
                e1_scale[p, i, j] = np.mean(np.abs((1 + c) * ds[i]) + np.abs(c * ds[p]) + np.abs(ds[j]))
                for f in range(2):
                    a = fd[i][f] - fd[p][f]
                    b = fd[j][f] - fd[i][f]
                    cross[p, i, j, f] = np.mean(a * b)
                    cross_scale[p, i, j, f] = np.mean(np.abs(a * b))
    for i in range(n):
        for j in range(n):
            for f in range(2):
                sq[i, j, f] = np.mean((fd[i][f] - fd[j][f]) ** 2)
                gram[i, j, f] = np.mean(fd[i][f] * fd[j][f])
                gram_scale[i, j, f] = np.mean(np.abs(fd[i][f] * fd[j][f]))
    out.update(e1=e1, e1_scale=e1_scale, sq=sq, cross=cross, cross_scale=cross_scale, gram=gram,
               gram_scale=gram_scale)
    return out


def profile_sums(branches: list[dict]) -> dict:
    """A profile's sums over samples (one per complete branch) from per-branch statistics."""
    return {k: sum(b[k] for b in branches) for k in branches[0]}


def close(got, want, scale=None, rtol: float = 2e-5, k: float = 16.0) -> np.ndarray:
    """|got − want| ≤ rtol·|want| + k·eps32·scale elementwise (scale: the magnitude of the rounded terms)."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    tol = rtol * np.abs(want) + (0.0 if scale is None else k * EPS32 * np.asarray(scale))
    return np.abs(got - want) <= tol


def assert_close(name, got, want, scale=None, rtol: float = 2e-5, k: float = 16.0) -> None:
    ok = close(got, want, scale, rtol, k)
    if not np.all(ok):
        idx = tuple(int(v) for v in np.argwhere(~ok)[0])
        g, w = np.asarray(got)[idx], np.asarray(want)[idx]
        raise AssertionError(f"{name}{list(idx)}: recorder {g!r}, oracle {w!r} ({int((~ok).sum())} of {ok.size} "
                             "entries differ beyond float32 accumulation)")


def lstsq_fit(ys: list[np.ndarray], xs: list[list[np.ndarray]]):
    """Pooled least squares over samples, each sample weighted equally (rows scaled by 1/√m_s): weights w of
    y ≈ Σ_k w_k x_k and the mean over samples of each sample's mean squared residual."""
    rows_x, rows_y = [], []
    for y, x in zip(ys, xs):
        s = 1.0 / math.sqrt(len(y))
        rows_x.append(np.stack(x, axis=1) * s)
        rows_y.append(y * s)
    X, Y = np.concatenate(rows_x), np.concatenate(rows_y)
    w = np.linalg.lstsq(X, Y, rcond=None)[0]
    return w, float(np.mean([np.mean((y - np.stack(x, axis=1) @ w) ** 2) for y, x in zip(ys, xs)]))
