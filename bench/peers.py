"""GCache Apply (auto) beside every alternative a user has, on the two trained tiny models: ComfyUI's own cache
nodes, EasyCache and LazyCache (at their default window and at the widest), and plain sampling with fewer steps.

The models are comfy_models/'s trained Flux-class and Wan 2.1-class files, loaded as comfy_models.families.load loads
them (ComfyUI's UNETLoader loader on 0.33). Every row samples through ComfyUI's nodes in this process, as a workflow
MODEL -> [GCache Apply | EasyCache | LazyCache] -> KSampler runs them: the nodes' own execute() and KSampler's
common_ksampler (Flux: euler / simple, CFG 3.5; Wan: uni_pc / simple, CFG 5; 20 steps; a "negative" prompt).
Rows:
- plain: every step computed (the reference of every quality figure);
- GCache Apply (auto) at each target speed-up, after its run 1 (a full-compute profiling run on a seed and prompt
  outside the held-out set);
- GCache Apply (auto) at each K of --auto-k: the node with the target whose predicted speed-up, at the io share
  run 1 measured, is that K's (so auto builds its policy for exactly that K from run 1's profile, by its own code);
- GCache Search (--search-budget) at each target row's K;
- plain sampling with fewer steps: KSampler with K steps, the same sampler and scheduler, at each K of --fewer-k
  (every K an auto row computes, and 14 and 16);
- EasyCache and LazyCache at each threshold, at their default window (start 0.15, end 0.95) and at the widest
  (start 0, end 1: --wide-thresholds, which reach past 6x).
Per row: block-stack passes per sampling run (a forward pre-hook on the first block: a CFG pair batched together
counts once), the speed-up on two axes (bench/peers_compare.py: in passes, and in io-inclusive cost, where a GCache
step that skips still costs the io share r run 1 measured), wall clock per run and its speed-up beside them, and
PSNR / SSIM of the decoded pixels (comfy_models/data.py's exact inverse projection) against plain 20 steps on the
same seed and prompt, per pair. Headline, on each axis: for every GCache row, each alternative's PSNR at the row's
speed-up (per pair, interpolated linearly between its two rows around it), the best of them, and GCache's PSNR minus
the best's, with a bootstrap 95 % interval over the pairs.

    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.bench.peers [--seeds 16] [--families flux wan] [--quick]

Ends with one JSON line.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time

from .cli import BenchParser, Progress, require_comfyui, run_main, whole
from .peers_compare import AXES, bootstrap, headline, interpolate, search_vs_auto, speedups  # noqa: F401

SETTINGS = {"flux": {"sampler": "euler", "scheduler": "simple", "cfg": 3.5},
            "wan": {"sampler": "uni_pc", "scheduler": "simple", "cfg": 5.0}}
THRESHOLDS = (0.05, 0.1, 0.2, 0.4, 0.7, 1.2, 2.0)
WIDE_THRESHOLDS = (0.1, 0.2, 0.4, 0.7, 1.2, 3.0, 8.0, 50.0)  # 8: about 6.7x, 50: 10x (2 of 20 steps)
DEFAULT_WINDOW, WIDE_WINDOW = (0.15, 0.95), (0.0, 1.0)
TARGETS = (1.5, 2.0, 3.0, 4.0)
AUTO_K = tuple(range(2, 13))
FEWER_K = AUTO_K + (14, 16)  # 14 and 16: below auto's 1.5x on the io-inclusive axis
PROFILE_SEED = 10 ** 6  # auto's run 1 (seed and prompt 0): outside the held-out pairs (seeds 0 ..)
FIRST_BLOCK = {"flux": "double_blocks.0", "wan": "blocks.0"}
QUICK = ["--seeds", "4", "--search-budget", "0", "--auto-k", "2", "4", "6", "8", "12",
         "--fewer-k", "2", "4", "6", "8", "12", "16",
         "--thresholds", "0.1", "0.4", "2", "--wide-thresholds", "0.2", "1.2", "8", "50"]


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.peers", __doc__)
    ap.add_argument("--seeds", type=whole(1), default=16,
                    help="held-out seed x prompt pairs (seed s, prompt s mod classes)")
    ap.add_argument("--steps", type=whole(4), default=20)
    ap.add_argument("--families", nargs="+", default=["flux", "wan"], choices=("flux", "wan"))
    ap.add_argument("--targets", nargs="+", type=float, default=list(TARGETS))
    ap.add_argument("--auto-k", nargs="*", type=whole(1), default=list(AUTO_K),
                    help="GCache Apply (auto) at these K computed steps too (none: no such rows)")
    ap.add_argument("--fewer-k", nargs="*", type=whole(1), default=None,
                    help=f"plain sampling with these step counts (default: {' '.join(map(str, FEWER_K))}, those "
                         "below --steps)")
    ap.add_argument("--thresholds", nargs="+", type=float, default=list(THRESHOLDS))
    ap.add_argument("--wide-thresholds", nargs="*", type=float, default=list(WIDE_THRESHOLDS),
                    help="EasyCache and LazyCache at start 0, end 1 with these thresholds (none: no wide rows)")
    ap.add_argument("--easycache-as-is", type=float, default=0.2, metavar="THRESHOLD",
                    help="one more EasyCache row without the input copy (see input_copied)")
    ap.add_argument("--search-budget", type=whole(0), default=0, metavar="N",
                    help="also GCache Search's policy (the real node, this budget) at each auto row's K, with auto's "
                         "profile and forecaster, searched on seeds outside the held-out pairs (0: no search rows)")
    ap.add_argument("--quick", action="store_true",
                    help="a smaller run for a first look (about a fifth of the time): " + " ".join(QUICK))
    ap.add_argument("--models", default=None, help="folder of <family>_tiny.safetensors (default: comfy_models/)")
    a = ap.parse_args(argv)
    if a.quick:
        a = ap.parse_args(QUICK + list(argv if argv is not None else sys.argv[1:]))
    if a.fewer_k is None:
        a.fewer_k = [k for k in FEWER_K if k < a.steps]
    if any(t <= 1 for t in a.targets):
        ap.error(f"--targets {' '.join(f'{t:g}' for t in a.targets)}: a target speed-up is above 1")
    if any(t <= 0 for t in a.thresholds + a.wide_thresholds):
        ap.error("--thresholds / --wide-thresholds: a cache threshold is above 0")
    if any(k >= a.steps for k in a.auto_k + a.fewer_k):
        ap.error(f"--auto-k / --fewer-k: a K is below --steps ({a.steps})")
    require_comfyui(ap)
    import torch

    from ..comfy_models import families
    families.use_comfyui()
    torch.set_num_threads(1)
    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False
    out = {"steps": a.steps, "held_out_pairs": a.seeds, "comfyui": families.comfyui_version(), "families": {}}
    n_rows = (2 + len(a.targets) * (2 if a.search_budget else 1) + len(a.auto_k) + len(a.fewer_k)
              + 2 * (len(a.thresholds) + len(a.wide_thresholds)))
    progress = Progress(len(a.families) * n_rows, "peers: rows", expected_s=0.8 * a.seeds * n_rows)
    for name in a.families:
        with torch.inference_mode():  # as ComfyUI's executor runs every node (execution.py)
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
    from ..core.policy import Policy
    from ..core.profile import Profile
    from ..search.infra.objectives import psnr, ssim
    GCacheApply, EasyCacheNode, LazyCacheNode = _nodes()
    loaded = load(family, os.path.join(a.models, family.file) if a.models else None)
    m = loaded.patcher
    s = SETTINGS[family.name]
    pairs = [(seed, seed % len(family.classes)) for seed in range(a.seeds)]

    def run(model, seed, label, steps=a.steps):
        lat = torch.zeros(1, *family.latent_shape)
        with Passes(m, family.name) as p:
            t0 = time.perf_counter()
            z = comfy_nodes.common_ksampler(model, seed, steps, s["cfg"], s["sampler"], s["scheduler"],
                                            comfy_cond(family, label), comfy_cond(family, -1),
                                            {"samples": lat})[0]["samples"]
            secs = time.perf_counter() - t0
        px = data.decode(m.model.process_latent_in(z))[0].clamp(-1, 1) * 0.5 + 0.5  # (3, [T,] H, W) in [0, 1]
        frames = px.unsqueeze(1) if px.dim() == 3 else px  # (3, T, H, W): SSIM per frame
        return frames.permute(1, 0, 2, 3), p.n, secs

    def row(model_for_pair, label, steps=a.steps, **info):
        passes, secs, ps, ss = [], [], [], []
        for (seed, lab), ref in zip(pairs, refs):
            img, n, t = run(model_for_pair(), seed, lab, steps)
            passes.append(n)
            secs.append(t)
            ps.append(round(psnr(img, ref), 3))
            ss.append(round(ssim(img, ref), 4))
        r = {"row": label, **info, "passes": passes, "seconds": [round(x, 4) for x in secs], "psnr": ps, "ssim": ss}
        progress.step(f"{family.name} {label}: {statistics.mean(passes):.1f} passes, "
                      f"PSNR {statistics.mean(ps):.2f} dB, SSIM {statistics.mean(ss):.4f}")
        return r

    def auto_row(gdir, target, label, **info):
        """GCache Apply (auto) at this target, and the policy it saved for it (made by run 1 or the row's first run:
        listed after it)."""
        r = row(lambda: GCacheApply.execute(m, "(auto)", "model device", "remap", target).result[0], label,
                target=target, **info)
        r["policies"] = sorted(f for f in os.listdir(gdir) if f.endswith(f"_{target:g}x.json"))
        if len(r["policies"]) == 1:
            pol = Policy.load(os.path.join(gdir, r["policies"][0]))
            r.update(mask=list(pol.mask), forecast=pol.forecast)
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
            profile_file = next(f for f in os.listdir(gdir) if f.endswith(".profile.safetensors"))
            io_share = Profile.load(os.path.join(gdir, profile_file)).io.value  # what auto's K rests on
            for target in a.targets:
                rows.append(auto_row(gdir, target, f"GCache auto {target:g}x", kind="gcache"))
            for k in a.auto_k:
                rows.append(auto_row(gdir, auto_target(a.steps, k, io_share), f"GCache auto K={k}", kind="gcache k",
                                     k=k))
                if rows[-1]["passes"][0] != k:
                    raise RuntimeError(f"GCache auto's target for K = {k} computed {rows[-1]['passes'][0]} steps")
            if a.search_budget:
                rows += search_rows(a, family, m, gdir, rows, row)
        finally:
            if old is None:
                folder_paths.folder_names_and_paths.pop("gcache", None)
            else:
                folder_paths.folder_names_and_paths["gcache"] = old
    for k in a.fewer_k:
        rows.append(row(lambda: m, f"plain {k} steps", steps=k, kind="fewer steps", k=k))
    copied = input_copied(m)
    for window, thresholds, suffix in ((DEFAULT_WINDOW, a.thresholds, ""), (WIDE_WINDOW, a.wide_thresholds, " wide")):
        for peer, node in (("EasyCache", EasyCacheNode), ("LazyCache", LazyCacheNode)):
            for thr in thresholds:
                rows.append(row(lambda: node.execute(copied if peer == "EasyCache" else m, thr, *window,
                                                     False).result[0],
                                f"{peer}{suffix} {thr:g}", kind=peer + suffix, threshold=thr, window=list(window)))
    if a.easycache_as_is is not None:  # EasyCache on the float32 model as it is: its in-place add hits x itself
        thr = a.easycache_as_is
        rows.append(row(lambda: EasyCacheNode.execute(m, thr, *DEFAULT_WINDOW, False).result[0],
                        f"EasyCache {thr:g} (no input copy)", kind="EasyCache as is", threshold=thr))
    base_passes, base_secs = statistics.mean(plain["passes"]), statistics.mean(plain["seconds"])
    for r in rows:
        r.update(speedups(r, a.steps, base_passes, io_share))
        r["speedup_wall"] = round(base_secs / statistics.mean(r["seconds"]), 3)
        r["psnr_mean"], r["ssim_mean"] = round(statistics.mean(r["psnr"]), 3), round(statistics.mean(r["ssim"]), 4)
    return {"settings": {**s, "steps": a.steps, "loaded_by": loaded.path, "training": loaded.training},
            "pairs": pairs, "plain": plain, "io_share": round(io_share, 5), "rows": rows,
            "headline": {axis: headline(rows, axis) for axis in AXES}, "search_vs_auto": search_vs_auto(rows)}


def auto_target(n_steps: int, k: int, io_share: float) -> float:
    """The target speed-up auto turns into exactly K computed steps: K's own predicted speed-up at the io share."""
    from ..core.policy import predicted_speedup
    return predicted_speedup(n_steps, k, io_share)


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


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.peers"))
