"""GCache Apply (auto) beside ComfyUI's own cache nodes, EasyCache and LazyCache, on the two trained tiny models.

The models are comfy_models/'s trained Flux-class and Wan 2.1-class files, loaded as comfy_models.families.load loads
them (ComfyUI's UNETLoader loader on 0.33). Every row samples through ComfyUI's nodes in this process, as a workflow
MODEL -> [GCache Apply | EasyCache | LazyCache] -> KSampler runs them: the nodes' own execute() and KSampler's
common_ksampler (Flux: euler / simple, CFG 3.5; Wan: uni_pc / simple, CFG 5; 20 steps; a "negative" prompt).
Rows:
- plain: every step computed (the reference of every quality figure);
- GCache Apply (auto) at each target speed-up, after its run 1 (a full-compute profiling run on a seed and prompt
  outside the held-out set);
- EasyCache and LazyCache at each threshold (start 0.15, end 0.95: the nodes' defaults).
Per row: block-stack passes per sampling run (a forward pre-hook on the first block: a CFG pair batched together
counts once) and the speed-up they give against plain, wall clock per run and its speed-up beside it, and PSNR / SSIM
of the decoded pixels (comfy_models/data.py's exact inverse projection) against plain on the same seed and prompt,
per pair. Headline: GCache's PSNR minus each peer's at GCache's measured pass speed-up (the peer's per-pair PSNR
interpolated linearly between its two rows around that speed-up), with a bootstrap 95 % interval over the pairs;
none where the peer's rows do not reach that speed-up.

    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.bench.peers [--seeds 16] [--families flux wan]

Ends with one JSON line.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile
import time

from .cli import BenchParser, Progress, require_comfyui, run_main, whole

SETTINGS = {"flux": {"sampler": "euler", "scheduler": "simple", "cfg": 3.5},
            "wan": {"sampler": "uni_pc", "scheduler": "simple", "cfg": 5.0}}
THRESHOLDS = (0.05, 0.1, 0.2, 0.4, 0.7, 1.2, 2.0)
TARGETS = (1.5, 2.0, 3.0, 4.0)
PROFILE_SEED = 10 ** 6  # auto's run 1 (seed and prompt 0): outside the held-out pairs (seeds 0 ..)
BOOTSTRAP = 2000
FIRST_BLOCK = {"flux": "double_blocks.0", "wan": "blocks.0"}


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.peers", __doc__)
    ap.add_argument("--seeds", type=whole(1), default=16, help="held-out seed x prompt pairs (seed s, prompt s mod "
                                                               "classes)")
    ap.add_argument("--steps", type=whole(4), default=20)
    ap.add_argument("--families", nargs="+", default=["flux", "wan"], choices=("flux", "wan"))
    ap.add_argument("--targets", nargs="+", type=float, default=list(TARGETS))
    ap.add_argument("--thresholds", nargs="+", type=float, default=list(THRESHOLDS))
    ap.add_argument("--easycache-as-is", type=float, default=0.2, metavar="THRESHOLD",
                    help="one more EasyCache row without the input copy (see input_copied)")
    ap.add_argument("--search-budget", type=whole(0), default=0, metavar="N",
                    help="also GCache Search's policy (the real node, this budget) at each auto row's K, with auto's "
                         "profile and forecaster, searched on seeds outside the held-out pairs (0: no search rows)")
    ap.add_argument("--models", default=None, help="folder of <family>_tiny.safetensors (default: comfy_models/)")
    a = ap.parse_args(argv)
    if any(t <= 1 for t in a.targets):
        ap.error(f"--targets {' '.join(f'{t:g}' for t in a.targets)}: a target speed-up is above 1")
    if any(t <= 0 for t in a.thresholds):
        ap.error(f"--thresholds {' '.join(f'{t:g}' for t in a.thresholds)}: a cache threshold is above 0")
    require_comfyui(ap)
    import torch

    from ..comfy_models import families
    families.use_comfyui()
    torch.set_num_threads(1)
    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False
    out = {"steps": a.steps, "held_out_pairs": a.seeds, "comfyui": families.comfyui_version(), "families": {}}
    n_rows = 2 + len(a.targets) * (2 if a.search_budget else 1) + 2 * len(a.thresholds)
    progress = Progress(len(a.families) * n_rows, "peers: rows", expected_s=6.0 * a.seeds * n_rows)
    for name in a.families:
        out["families"][name] = family_rows(a, families.FAMILIES[name], progress)
    print(json.dumps(out))
    return out


def _nodes():
    from comfy_extras.nodes_easycache import EasyCacheNode, LazyCacheNode

    from ..nodes.apply_node import GCacheApply
    return GCacheApply, EasyCacheNode, LazyCacheNode


class Passes:
    """Forward calls of the model's first block (one per block-stack pass; CFG's pair batched counts once)."""

    def __init__(self, patcher, family_name):
        block = patcher.get_model_object("diffusion_model").get_submodule(FIRST_BLOCK[family_name])
        self.n = 0
        self.h = block.register_forward_pre_hook(lambda *a: setattr(self, "n", self.n + 1))

    def __enter__(self):
        return self

    def __exit__(self, *e):
        self.h.remove()


def input_copied(patcher):
    """A clone of the model whose diffusion model gets a copy of its input, as ComfyUI itself gives it whenever the
    model's dtype differs from the latent's (xc.to(dtype) in BaseModel._apply_model: any fp16 / bf16 model). EasyCache
    adds its cached difference into that input in place (EasyCacheHolder.apply_cache_diff: x[...] += diff), and with
    a float32 model on a flow model (CONST.calculate_input returns x itself) that input is the very x the sampler then
    denoises against: its skipped steps come out wrong. The wrapper is added first, so it runs outside EasyCache's."""
    import comfy.patcher_extension
    m = patcher.clone()
    m.add_wrapper_with_key(comfy.patcher_extension.WrappersMP.DIFFUSION_MODEL, "gcache_bench_input_copy",
                           lambda executor, x, *args, **kwargs: executor(x.clone(), *args, **kwargs))
    return m


def family_rows(a, family, progress) -> dict:
    import folder_paths
    import torch

    import nodes as comfy_nodes

    from ..comfy_models import data
    from ..comfy_models.families import comfy_cond, load
    from ..search.infra.objectives import psnr, ssim
    GCacheApply, EasyCacheNode, LazyCacheNode = _nodes()
    loaded = load(family, os.path.join(a.models, family.file) if a.models else None)
    m = loaded.patcher
    s = SETTINGS[family.name]
    pairs = [(seed, seed % len(family.classes)) for seed in range(a.seeds)]

    def run(model, seed, label):
        lat = torch.zeros(1, *family.latent_shape)
        with Passes(m, family.name) as p:
            t0 = time.perf_counter()
            z = comfy_nodes.common_ksampler(model, seed, a.steps, s["cfg"], s["sampler"], s["scheduler"],
                                            comfy_cond(family, label), comfy_cond(family, -1),
                                            {"samples": lat})[0]["samples"]
            secs = time.perf_counter() - t0
        px = data.decode(m.model.process_latent_in(z))[0].clamp(-1, 1) * 0.5 + 0.5  # (3, [T,] H, W) in [0, 1]
        frames = px.unsqueeze(1) if px.dim() == 3 else px  # (3, T, H, W): SSIM per frame
        return frames.permute(1, 0, 2, 3), p.n, secs

    def row(model_for_pair, label, **info):
        passes, secs, ps, ss = [], [], [], []
        for (seed, lab), ref in zip(pairs, refs):
            img, n, t = run(model_for_pair(), seed, lab)
            passes.append(n)
            secs.append(t)
            ps.append(round(psnr(img, ref), 3))
            ss.append(round(ssim(img, ref), 4))
        r = {"row": label, **info, "passes": passes, "seconds": [round(x, 4) for x in secs], "psnr": ps, "ssim": ss}
        progress.step(f"{family.name} {label}: {statistics.mean(passes):.1f} passes, "
                      f"PSNR {statistics.mean(ps):.2f} dB, SSIM {statistics.mean(ss):.4f}")
        return r

    refs, plain = [], {"row": "plain", "passes": [], "seconds": []}
    for seed, lab in pairs:
        img, n, t = run(m, seed, lab)
        refs.append(img)
        plain["passes"].append(n)
        plain["seconds"].append(round(t, 4))
    progress.step(f"{family.name} plain: {statistics.mean(plain['passes']):.1f} passes per run")
    rows = []
    with tempfile.TemporaryDirectory(prefix="gcache-peers-") as gdir:
        old = folder_paths.folder_names_and_paths.get("gcache")
        folder_paths.folder_names_and_paths["gcache"] = ([gdir], {".json", ".safetensors"})
        try:
            # auto's run 1: computes every step and profiles it (one seed and prompt outside the held-out pairs)
            run(GCacheApply.execute(m, "(auto)", "model device", "remap", a.targets[0]).result[0], PROFILE_SEED, 0)
            for target in a.targets:
                rows.append(row(lambda: GCacheApply.execute(m, "(auto)", "model device", "remap", target).result[0],
                                f"GCache auto {target:g}x", kind="gcache", target=target))
                # the policy auto saved for this target (made by the row's first run: listed after it)
                rows[-1]["policies"] = sorted(f for f in os.listdir(gdir) if f.endswith(f"_{target:g}x.json"))
            if a.search_budget:
                rows += search_rows(a, family, m, gdir, rows, row)
        finally:
            if old is None:
                folder_paths.folder_names_and_paths.pop("gcache", None)
            else:
                folder_paths.folder_names_and_paths["gcache"] = old
    copied = input_copied(m)
    for peer, node in (("EasyCache", EasyCacheNode), ("LazyCache", LazyCacheNode)):
        for thr in a.thresholds:
            rows.append(row(lambda: node.execute(copied if peer == "EasyCache" else m, thr, 0.15, 0.95,
                                                 False).result[0],
                            f"{peer} {thr:g}", kind=peer, threshold=thr))
    if a.easycache_as_is is not None:  # EasyCache on the float32 model as it is: its in-place add hits x itself
        thr = a.easycache_as_is
        rows.append(row(lambda: EasyCacheNode.execute(m, thr, 0.15, 0.95, False).result[0],
                        f"EasyCache {thr:g} (no input copy)", kind="EasyCache as is", threshold=thr))
    base_passes, base_secs = statistics.mean(plain["passes"]), statistics.mean(plain["seconds"])
    for r in rows:
        r["speedup_passes"] = round(base_passes / statistics.mean(r["passes"]), 3)
        r["speedup_wall"] = round(base_secs / statistics.mean(r["seconds"]), 3)
        r["psnr_mean"], r["ssim_mean"] = round(statistics.mean(r["psnr"]), 3), round(statistics.mean(r["ssim"]), 4)
    return {"settings": {**s, "steps": a.steps, "loaded_by": loaded.path, "training": loaded.training},
            "pairs": pairs, "plain": plain, "rows": rows, "headline": headline(rows),
            "search_vs_auto": search_vs_auto(rows)}


SEARCH_SEEDS = (200, 2)  # GCache Search's seeds (first, count), prompt 0: outside the held-out pairs


class PixelVAE:
    """comfy_models' exact inverse projection as a VAE for GCache Search: LATENT -> (B[*T], H, W, 3) in [0, 1]."""

    def __init__(self, patcher):
        self.model = patcher.model

    def decode(self, samples):
        from ..comfy_models import data
        px = data.decode(self.model.process_latent_in(samples)).clamp(-1, 1) * 0.5 + 0.5
        if px.dim() == 5:  # video: frames into the batch
            px = px.movedim(2, 1).flatten(0, 1)
        return px.movedim(1, -1)


def search_rows(a, family, m, gdir, rows, row) -> list:
    """GCache Search (the node) at each auto row's K, with auto's saved profile and its policy's forecaster, then
    applied through GCache Apply with the policy connected. Its files go to a folder of their own, so that auto's
    rows above never saw them."""
    import folder_paths
    import torch

    from ..comfy_models.families import comfy_cond
    from ..core import forecasters
    from ..core.policy import Policy
    from ..core.profile import Profile
    from ..nodes.apply_node import GCacheApply
    from ..nodes.search_node import GCacheSearch
    s = SETTINGS[family.name]
    profile = Profile.load(next(os.path.join(gdir, f) for f in os.listdir(gdir) if f.endswith(".profile.safetensors")))
    out = []
    with tempfile.TemporaryDirectory(prefix="gcache-peers-search-") as sdir:
        folder_paths.folder_names_and_paths["gcache"] = ([sdir], {".json", ".safetensors"})
        for g in [r for r in rows if r["kind"] == "gcache"]:
            k = g["passes"][0]
            auto_policy = Policy.load(os.path.join(gdir, g["policies"][0]))
            label = forecasters.get(auto_policy.forecast).label
            policy = GCacheSearch.execute(m, comfy_cond(family, 0), comfy_cond(family, -1),
                                          {"samples": torch.zeros(1, *family.latent_shape)}, PixelVAE(m),
                                          SEARCH_SEEDS[0], SEARCH_SEEDS[1], a.steps, s["cfg"], s["sampler"],
                                          s["scheduler"], k, a.search_budget, 2, "psnr", f"peers_{family.name}_K{k}",
                                          profile=profile, forecast=label).result[0]
            out.append(row(lambda: GCacheApply.execute(m, "(auto)", "model device", "remap", policy=policy).result[0],
                           f"GCache Search K={k}", kind="gcache search", k=k, forecast=auto_policy.forecast,
                           budget=a.search_budget, mask=list(policy.mask)))
        folder_paths.folder_names_and_paths["gcache"] = ([gdir], {".json", ".safetensors"})
    return out


def interpolate(curve, x):
    """Per-pair values of a peer at speed-up x: linear between the two rows whose mean speed-ups bracket x (rows of
    equal speed-up: their mean). None when x lies outside the peer's rows."""
    pts = {}
    for sp, vals in curve:
        pts.setdefault(sp, []).append(vals)
    xs = sorted(pts)
    if not xs or x < xs[0] - 1e-9 or x > xs[-1] + 1e-9:
        return None
    avg = {k: [statistics.mean(v) for v in zip(*pts[k])] for k in xs}
    for lo, hi in zip(xs, xs[1:] + [xs[-1]]):
        if lo - 1e-9 <= x <= hi + 1e-9:
            w = 0.0 if hi == lo else (x - lo) / (hi - lo)
            return [(1 - w) * p + w * q for p, q in zip(avg[lo], avg[hi])]
    return None


def bootstrap(diffs, n=BOOTSTRAP, seed=0):
    """95 % percentile interval of the mean over resampled pairs."""
    rng = random.Random(seed)
    means = sorted(statistics.mean(rng.choices(diffs, k=len(diffs))) for _ in range(n))
    return [round(means[int(0.025 * n)], 3), round(means[int(0.975 * n) - 1], 3)]


def search_vs_auto(rows) -> list:
    """GCache Search's PSNR minus auto's at the same K, per K (bootstrap over the pairs)."""
    out = []
    for srow in (r for r in rows if r["kind"] == "gcache search"):
        auto = next(r for r in rows if r["kind"] == "gcache" and r["passes"][0] == srow["k"])
        diffs = [a - b for a, b in zip(srow["psnr"], auto["psnr"])]
        out.append({"k": srow["k"], "search": srow["row"], "auto": auto["row"],
                    "psnr_diff": round(statistics.mean(diffs), 3), "interval": bootstrap(diffs)})
    return out


def headline(rows) -> list:
    out = []
    for g in (r for r in rows if r["kind"] in ("gcache", "gcache search")):
        for peer in ("EasyCache", "LazyCache"):
            curve = [(r["speedup_passes"], r["psnr"]) for r in rows if r["kind"] == peer]
            at = interpolate(curve, g["speedup_passes"])
            item = {"gcache": g["row"], "peer": peer, "speedup_passes": g["speedup_passes"]}
            if at is None:
                item.update(psnr_diff=None, why=f"{peer}'s rows span {min(c[0] for c in curve):.2f}-"
                                               f"{max(c[0] for c in curve):.2f}x only")
            else:
                diffs = [a - b for a, b in zip(g["psnr"], at)]
                item.update(psnr_diff=round(statistics.mean(diffs), 3), interval=bootstrap(diffs),
                            peer_psnr=round(statistics.mean(at), 3))
                ssim_at = interpolate([(r["speedup_passes"], r["ssim"]) for r in rows if r["kind"] == peer],
                                      g["speedup_passes"])
                if ssim_at is not None and "ssim" in g:
                    sd = [a - b for a, b in zip(g["ssim"], ssim_at)]
                    item.update(ssim_diff=round(statistics.mean(sd), 4), ssim_interval=bootstrap(sd))
            out.append(item)
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.peers"))
