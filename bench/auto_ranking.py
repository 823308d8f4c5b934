"""Does auto's prediction rank (mask, forecaster) pairs the way their measured quality does? (issue 49, item 2)

For each model and K (of N = 20 steps) a set of masks spread over the mask space is applied with every forecaster
and scored by PSNR against full compute on held-out pairs. Masks: auto's (the reuse DP's theory mask), each
forecaster's own DP mask under the mean_abs and rms error models, the reuse DP under w = 0, evenly spaced steps and
--random random masks (step 0 always computed). Beside each measured pair stands what auto predicts for it: its
forecaster score (search/instant.py forecaster_scores: the held-out bound, lower is better) and, for each candidate
predictor in PREDICTORS, its value. Per (model, K): the Spearman rank correlation of each predictor with the measured
PSNR (over the pairs it scores), the pairs the score misranks most, auto's pick and the best pair measured, and a plain
K-step run (fewer steps: same sampler, scheduler, seeds).

Models: "reference" (headless, euler, shift 2, CFG 3, 16 held-out seeds; profile on 8 seeds as the quality bench),
"flux" and "wan" (comfy_models' trained tiny models in ComfyUI, COMFYUI_PATH: euler / uni_pc, as bench/peers.py
samples them; run 1 is auto's own profiling run on bench/peers.py's PROFILE_SEED; held-out pairs are --per-label
noises of each class prompt, batched into one sampling call per class).

    python -m gcache.bench.auto_ranking --models reference                       # about 6 min on one core
    COMFYUI_PATH=… python -m gcache.bench.auto_ranking --models flux wan         # about 20 min on one core

Ends with one JSON line.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import sys
import tempfile

from .cli import BenchParser, Progress, run_main, whole

KS = (3, 4, 5, 6, 8, 10, 12)
STEPS = 20
PROFILE_SEEDS = list(range(1000, 1008))  # the reference model's run 1 (one batch, as bench/quality.py profiles)


# ------------------------------------------------------------------------------------------ masks and predictions
def even_mask(n: int, k: int) -> list:
    idx = {round(i * n / k) for i in range(k)}
    return [int(i in idx) for i in range(n)]


def random_masks(n: int, k: int, count: int, seed: int) -> list:
    rng = random.Random(seed * 1000 + k)
    out = []
    for _ in range(count):
        steps = {0} | set(rng.sample(range(1, n), k - 1))
        out.append([int(i in steps) for i in range(n)])
    return out


def candidate_masks(profile, k: int, n_random: int) -> dict:
    """name -> mask, the same mask listed once (under its first name)."""
    from ..core import forecasters
    from ..search import error_models
    from ..search.instant import auto_policy, forecast_dp, propagation_weights
    w = propagation_weights(profile, "theory")
    found = {"auto": auto_policy(profile, k, "linear").mask}
    for fc in ("linear", "fitted"):
        for model in ("mean_abs", "rms"):
            if error_models.applies(model, forecasters.get(fc)):
                found[f"dp_{fc}_{model}"] = forecast_dp(profile, w, k, fc, model)[0]
    found["dp_reuse_local"] = forecast_dp(profile, propagation_weights(profile, "local"), k, "reuse")[0]
    found["even"] = even_mask(profile.n_steps, k)
    for i, m in enumerate(random_masks(profile.n_steps, k, n_random, 0)):
        found[f"random{i}"] = m
    out, seen = {}, set()
    for name, m in found.items():
        key = tuple(int(v) for v in m)
        if key not in seen:
            seen.add(key)
            out[name] = list(key)
    return out


def auto_score(profile, mask, forecaster) -> float | None:
    """auto's forecaster score for (mask, forecaster): the held-out bound forecaster_scores gives a forecaster's
    mask (None: a forecaster without a two-step form, which auto does not choose)."""
    import numpy as np

    from ..core import forecasters
    from ..search.instant import _bound, propagation_weights
    fc = forecasters.get(forecaster)
    if not profile.has_fit_stats():
        return None
    st = profile.fit_stats()
    if fc.two_step_c(profile, st, 0) is None:
        return None
    ew = np.exp(propagation_weights(profile, "theory"))
    return float(np.mean([_bound(mask, np.sqrt(st.sq_of(f)), st.rms(fc.two_step_c(profile, st, 1 - f), f), ew)
                          for f in (0, 1)]))


def spearman(xs, ys) -> float | None:
    """Rank correlation (average ranks on ties); None with fewer than 3 points or no spread."""
    if len(xs) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(v):
            j = i
            while j + 1 < len(v) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for m in range(i, j + 1):
                r[order[m]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(list(xs)), ranks(list(ys))
    mx, my = statistics.mean(rx), statistics.mean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else round(sxy / (sxx * syy) ** 0.5, 3)


# ------------------------------------------------------------------------------------------ models
class Reference:
    """The headless reference model (euler, shift 2, CFG 3)."""
    name = "reference"

    def __init__(self, a):
        from ..reference_model.harness import ReferenceHarness
        from ..search.infra.cli import parse_seeds
        self.h = ReferenceHarness(STEPS)
        self.profile = self.h.profile(PROFILE_SEEDS, forecast=True)
        self.seeds = parse_seeds(a.eval_seeds)
        self.ref = self.h.full(self.seeds)
        self.pairs = len(self.seeds)

    def psnr(self, policy) -> list:
        img, _ = self.h.run(self.seeds, policy.mask, forecast=policy.forecast, forecast_params=policy.forecast_params)
        return per_image_psnr(img, self.ref)

    def fewer(self, k: int) -> list:
        from ..reference_model.harness import ReferenceHarness
        return per_image_psnr(ReferenceHarness(k).full(self.seeds), self.ref)

    def run1(self, policy=None):
        """Run 1's output again (the profiled seeds) under `policy` (None: every step computed)."""
        if policy is None:
            return self.h.full(PROFILE_SEEDS)
        return self.h.run(PROFILE_SEEDS, policy.mask, forecast=policy.forecast,
                          forecast_params=policy.forecast_params)[0]


def per_image_psnr(img, ref) -> list:
    from ..search.infra.objectives import psnr
    return [round(psnr(img[i:i + 1], ref[i:i + 1]), 3) for i in range(img.shape[0])]


class Comfy:
    """A trained tiny model in ComfyUI (bench/peers.py's settings); each class prompt's pairs in one sampling call."""

    def __init__(self, a, name, tmp):
        import folder_paths
        import torch

        from ..comfy_models import families
        from ..core.profile import Profile
        from ..nodes.apply_node import GCacheApply
        from .peers import PROFILE_SEED, SETTINGS
        self.name = name
        self.family = families.FAMILIES[name]
        self.m = families.load(self.family).patcher
        self.s = SETTINGS[name]
        self.labels = list(range(len(self.family.classes)))
        self.per_label = a.per_label
        self.pairs = len(self.labels) * self.per_label
        self.torch = torch
        folder_paths.folder_names_and_paths["gcache"] = ([tmp], {".json", ".safetensors"})
        # auto's run 1 (batch 1, seed and prompt outside the held-out pairs): its profile is what auto builds from
        self.sample(GCacheApply.execute(self.m, "(auto)", "model device", "remap", 2.0).result[0], PROFILE_SEED, 0,
                    batch=1)
        self.profile = Profile.load(next(os.path.join(tmp, f) for f in os.listdir(tmp)
                                         if f.endswith(".profile.safetensors")))
        self.ref = self.images(self.m)

    def sample(self, model, seed, label, batch, steps=STEPS, latent=False):
        import nodes as comfy_nodes

        from ..comfy_models import data
        from ..comfy_models.families import comfy_cond
        lat = {"samples": self.torch.zeros(batch, *self.family.latent_shape)}
        z = comfy_nodes.common_ksampler(model, seed, steps, self.s["cfg"], self.s["sampler"], self.s["scheduler"],
                                        comfy_cond(self.family, label), comfy_cond(self.family, -1), lat)[0]["samples"]
        if latent:
            return z
        px = data.decode(self.m.model.process_latent_in(z)).clamp(-1, 1) * 0.5 + 0.5
        return px.flatten(1)  # (batch, everything): PSNR per pair over every pixel (and frame)

    def images(self, model, steps=STEPS):
        return self.torch.cat([self.sample(model, 100 + lab, lab, self.per_label, steps) for lab in self.labels])

    def psnr(self, policy) -> list:
        from ..nodes.apply_node import GCacheApply
        model = GCacheApply.execute(self.m, "(auto)", "model device", "remap", policy=policy).result[0]
        return flat_psnr(self.images(model), self.ref)

    def fewer(self, k: int) -> list:
        return flat_psnr(self.images(self.m, k), self.ref)

    def run1(self, policy=None):
        """Run 1's output latent again (its seed and prompt, batch 1) under `policy` (None: every step computed), as
        auto's check resamples it (search/auto_check.py; in GCache Apply the OUTER_SAMPLE wrapper does it)."""
        from ..nodes.apply_node import GCacheApply
        from .peers import PROFILE_SEED
        model = self.m if policy is None else \
            GCacheApply.execute(self.m, "(auto)", "model device", "remap", policy=policy).result[0]
        return self.sample(model, PROFILE_SEED, 0, batch=1, latent=True)


def flat_psnr(img, ref) -> list:
    import torch
    mse = (img.double() - ref.double()).pow(2).mean(1)
    return [round(float(v), 3) for v in torch.where(mse > 0, -10 * torch.log10(mse.clamp_min(1e-30)),
                                                    torch.full_like(mse, 100.0)).clamp(max=100.0)]


# ------------------------------------------------------------------------------------------ the study
def study(model, a, progress) -> dict:
    from ..core import forecasters
    from ..core.policy import Policy
    from ..search import auto_check
    from ..search.instant import auto_policy, choose_forecaster
    prof = model.profile
    fcs = [f for f in forecasters.names() if f in a.forecasters]
    out = {"pairs": model.pairs, "io_share": round(prof.io_share, 4), "ks": []}
    for k in a.ks:
        pick, scores = choose_forecaster(prof, k)
        auto_mask = auto_policy(prof, k, pick).mask
        masks = candidate_masks(prof, k, a.random)
        rows = []
        for mname, mask in masks.items():
            for fc in fcs:
                pol = Policy.for_mask(prof, mask, fc)
                ps = model.psnr(pol)
                rows.append({"mask": mname, "steps": [i for i, v in enumerate(mask) if v], "forecaster": fc,
                             "psnr": round(statistics.mean(ps), 3), "per_pair": ps,
                             "score": auto_score(prof, mask, fc),
                             "auto": mask == auto_mask and fc == pick})
        if not any(r["auto"] for r in rows):  # auto's forecaster left out by --forecasters: measured all the same
            pol = auto_policy(prof, k, pick)
            ps = model.psnr(pol)
            rows.append({"mask": "auto", "steps": pol.compute_steps(), "forecaster": pick,
                         "psnr": round(statistics.mean(ps), 3), "per_pair": ps,
                         "score": auto_score(prof, pol.mask, pick),
                         "auto": True})
        fewer = model.fewer(k)
        # auto's true-loss check (search/auto_check.py) on run 1's inputs, as GCache Apply (auto) now runs it
        cands = auto_check.candidates(prof, k, first=auto_policy(prof, k, pick))
        ref1 = model.run1()
        chosen, rec = auto_check.check(cands, model.run1, ref1, auto_check.mse)
        hit = next((r for r in rows if r["steps"] == chosen.compute_steps() and r["forecaster"] == chosen.forecast),
                   None)
        checked_pp = hit["per_pair"] if hit is not None else model.psnr(chosen)
        scored = [r for r in rows if r["score"] is not None]
        rho = spearman([-r["score"] for r in scored], [r["psnr"] for r in scored])
        best = max(rows, key=lambda r: r["psnr"])
        auto = next(r for r in rows if r["auto"])
        # misranked: pairs the score puts above auto's pick... the worst disagreements between score rank and PSNR
        by_score = sorted(scored, key=lambda r: r["score"])
        by_psnr = sorted(scored, key=lambda r: -r["psnr"])
        rank_gap = sorted(scored, key=lambda r: -abs(by_score.index(r) - by_psnr.index(r)))[:3]
        item = {"K": k, "auto_forecaster": pick, "auto_psnr": auto["psnr"], "auto_steps": auto["steps"],
                "checked": {"forecaster": chosen.forecast, "steps": chosen.compute_steps(),
                            "psnr": round(statistics.mean(checked_pp), 3), "per_pair": checked_pp,
                            "candidates": rec["candidates"], "spent_steps": round(sum(
                                auto_check.cost_steps(c, prof.io_share) for c in cands), 3)},
                "best": {x: best[x] for x in ("mask", "forecaster", "steps", "psnr")},
                "fewer_steps_psnr": round(statistics.mean(fewer), 3), "spearman_score": rho,
                "spearman_by_forecaster": {f: spearman([-r["score"] for r in scored if r["forecaster"] == f],
                                                       [r["psnr"] for r in scored if r["forecaster"] == f])
                                           for f in fcs},
                "spearman_by_mask": {f: spearman([-r["score"] for r in scored if r["mask"] == f],
                                                 [r["psnr"] for r in scored if r["mask"] == f]) for f in masks},
                "misranked": [{x: r[x] for x in ("mask", "forecaster", "steps", "psnr", "score")} |
                              {"score_rank": by_score.index(r) + 1, "psnr_rank": by_psnr.index(r) + 1}
                              for r in rank_gap],
                "rows": rows}
        out["ks"].append(item)
        progress.step(f"{model.name} K = {k}: {len(rows)} pairs; auto ({pick}) {auto['psnr']:.2f} dB, checked "
                      f"({chosen.forecast} K = {chosen.n_computed}, {len(cands)} candidates) "
                      f"{item['checked']['psnr']:.2f} dB, best "
                      f"{best['forecaster']} on {best['mask']} {best['psnr']:.2f} dB, fewer steps "
                      f"{item['fewer_steps_psnr']:.2f} dB; Spearman(score, PSNR) {rho}")
    return out


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.auto_ranking", __doc__)
    ap.add_argument("--models", nargs="+", default=["reference"], choices=("reference", "flux", "wan"))
    ap.add_argument("--ks", nargs="+", type=whole(2), default=list(KS))
    ap.add_argument("--random", type=whole(0), default=2, help="random masks per K")
    ap.add_argument("--forecasters", nargs="+", default=["reuse", "linear", "quadratic", "fitted", "l2p"])
    ap.add_argument("--eval-seeds", default="0-15", help="the reference model's held-out seeds")
    ap.add_argument("--per-label", type=whole(1), default=2, help="ComfyUI models: held-out noises per class prompt")
    ap.add_argument("--keep-profiles", default=None, help="copy each model's profile into this folder")
    a = ap.parse_args(argv)
    if any(k >= STEPS for k in a.ks):
        ap.error(f"--ks {' '.join(map(str, a.ks))}: each K is below the {STEPS} steps")
    from ..core import forecasters
    unknown = [f for f in a.forecasters if f not in forecasters.names()]
    if unknown:
        ap.error(f"--forecasters {' '.join(unknown)}: not a forecaster (known: {', '.join(forecasters.names())})")
    import torch
    torch.set_num_threads(1)
    comfy = [m for m in a.models if m != "reference"]
    if comfy:
        from .cli import require_comfyui
        require_comfyui(ap)
        from ..comfy_models import families
        families.use_comfyui()
        import comfy.utils
        comfy.utils.PROGRESS_BAR_ENABLED = False
    out = {"steps": STEPS, "ks": a.ks, "models": {}}
    progress = Progress(len(a.models) * len(a.ks), "auto ranking: (model, K)", expected_s=40.0 * len(a.ks))
    for name in a.models:
        with tempfile.TemporaryDirectory(prefix="gcache-ranking-") as tmp:
            model = Reference(a) if name == "reference" else Comfy(a, name, tmp)
            if a.keep_profiles:
                os.makedirs(a.keep_profiles, exist_ok=True)
                model.profile.save(os.path.join(a.keep_profiles, f"{name}.profile.safetensors"))
            out["models"][name] = study(model, a, progress)
    if comfy:
        out["comfyui"] = families.comfyui_version()
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.auto_ranking"))
