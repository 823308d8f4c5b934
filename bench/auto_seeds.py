"""What GCache Apply (auto) gives across run-1 seeds (issue 49): auto builds its policy from the one run it profiles,
so its quality is a draw over the user's run 1. bench/auto_ranking.py and bench/peers.py profile one run 1 each.

This bench profiles --runs run-1 inputs of a trained tiny model in ComfyUI (seed PROFILE_SEED + r, prompt r mod the
class count; r = 0 is the other benches' run 1), and per K of 20 steps samples every candidate auto's true-loss
check can list (search/auto_check.py, without the budget) twice: on the run-1 inputs (its loss against run 1's own
output, what the check judges by) and on the held-out pairs (PSNR against full compute, what a user gets). From
those it reads, per run 1:
  instant      auto's instant policy (the first candidate);
  checked      the check's pick within one full run at the model's measured io share: what GCache Apply runs;
  checked@io   the same at --io-share (about a real model's: more candidates fit the same budget);
  best         the best candidate measured on the held-out pairs (no check on one seed can do better);
and, once per K, a plain K-step run (fewer steps). Per K and rule: the mean, min and max over the run-1 seeds, and
how many runs keep PSNR from falling from one K to the next.

The profile-fitted forecaster's α is fitted on run 1: --own-alpha also profiles each held-out pair and applies the
first run's instant mask with fitted α from run 1, with α fitted on the pair's own run (in-sample), and with linear,
which separates "α fitted on one run does not carry over" from "the fitted forecast itself is worse".

    COMFYUI_PATH=… python -m gcache.bench.auto_seeds --model wan      # about 15 min on one core
    COMFYUI_PATH=… python -m gcache.bench.auto_seeds --model flux     # about 10 min on one core

Ends with one JSON line.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import types

from .cli import BenchParser, Progress, number, require_comfyui, run_main, whole

KS = (3, 4, 5, 6, 8)
RULES = ("instant", "checked", "checked_io", "best")


def pick(cands, rows, key) -> dict:
    """The held-out row of the candidate the check keeps among `cands`: the lowest run-1 loss, a tie to the earlier
    one (search/auto_check.choose)."""
    listed = [rows[key(c)] for c in cands]
    return min(listed, key=lambda r: (r["run1_loss"], listed.index(r)))


def summary(values) -> dict:
    return {"mean": round(statistics.mean(values), 3), "min": min(values), "max": max(values)}


def monotone(per_run: list, ks: list) -> dict:
    """Per rule: in how many (run, K) steps from one K to the next PSNR did not fall, of how many."""
    out = {}
    for rule in RULES:
        held = total = 0
        for run in per_run:
            for a, b in zip(ks, ks[1:]):
                total += 1
                held += run[b][rule] >= run[a][rule]
        out[rule] = [held, total]
    return out


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.auto_seeds", __doc__)
    ap.add_argument("--model", default="wan", choices=("flux", "wan"))
    ap.add_argument("--runs", type=whole(1), default=6, help="run-1 inputs to profile")
    ap.add_argument("--ks", nargs="+", type=whole(2), default=list(KS))
    ap.add_argument("--per-label", type=whole(1), default=2, help="held-out noises per class prompt")
    ap.add_argument("--io-share", type=number(0.0, 1.0), default=0.01,
                    help="the io share checked@io budgets candidates at (default 0.01, about a real model's)")
    ap.add_argument("--own-alpha", action="store_true", help="also fitted with each held-out pair's own α")
    a = ap.parse_args(argv)
    from .auto_ranking import STEPS
    if any(k >= STEPS for k in a.ks):
        ap.error(f"--ks {' '.join(map(str, a.ks))}: each K is below the {STEPS} steps")
    require_comfyui(ap)
    import torch
    torch.set_num_threads(1)
    from ..comfy_models import families
    families.use_comfyui()
    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False
    with tempfile.TemporaryDirectory(prefix="gcache-auto-seeds-") as tmp:
        out = study(a, tmp)
    out["comfyui"] = families.comfyui_version()
    print(json.dumps(out))
    return out


def study(a, tmp) -> dict:
    from ..core.policy import Policy
    from ..core.profile import Profile
    from ..nodes.apply_node import GCacheApply
    from ..nodes.profile_node import GCacheProfile
    from ..search import auto_check
    from ..search.instant import auto_policy, choose_forecaster
    from .auto_ranking import Comfy, flat_psnr
    from .peers import PROFILE_SEED
    model = Comfy(types.SimpleNamespace(per_label=a.per_label), a.model, tmp)
    progress = Progress(a.runs * len(a.ks), f"auto across run-1 seeds ({a.model}): (run, K)",
                        expected_s=20.0 * a.runs * len(a.ks))

    def applied(policy):
        return GCacheApply.execute(model.m, "(auto)", "model device", "remap", policy=policy).result[0]

    def profiled(name, seed, label, batch=1):
        """A full run of (seed, label) under GCache Profile: its profile and its output latent."""
        z = model.sample(GCacheProfile.execute(model.m, name, "model device", True).result[0], seed, label, batch,
                         latent=True)
        return Profile.load(os.path.join(tmp, f"{name}.profile.safetensors")), z

    def key(p):
        return tuple(p.compute_steps()), p.forecast

    runs, per_run, first_masks = [], [], {}
    for r in range(a.runs):
        seed, label = PROFILE_SEED + r, r % len(model.labels)
        prof, z1 = profiled(f"run{r}", seed, label)
        run = {"seed": seed, "label": label, "io_share": round(prof.io_share, 4), "ks": []}
        values = {}
        for k in a.ks:
            first = auto_policy(prof, k, choose_forecaster(prof, k)[0])
            first_masks.setdefault(k, (prof, first.mask))
            every = auto_check.candidates(prof, k, first=first, budget_runs=1e6)
            rows = {}
            for c in every:
                m = applied(c)
                z = model.sample(m, seed, label, 1, latent=True)
                ps = flat_psnr(model.images(m), model.ref)
                rows[key(c)] = {"steps": c.compute_steps(), "forecast": c.forecast, "method": c.method,
                                "run1_loss": float(f"{auto_check.mse(z, z1):.6g}"),
                                "psnr": round(statistics.mean(ps), 3), "per_pair": ps}
            checked = auto_check.candidates(prof, k, first=first)
            at_io = auto_check.candidates(prof, k, first=first, io_share=a.io_share)
            got = {"instant": rows[key(first)], "checked": pick(checked, rows, key),
                   "checked_io": pick(at_io, rows, key), "best": max(rows.values(), key=lambda x: x["psnr"])}
            values[k] = {rule: got[rule]["psnr"] for rule in RULES}
            run["ks"].append({"K": k, "candidates": list(rows.values()), "checked_count": len(checked),
                              "checked_io_count": len(at_io),
                              **{rule: {x: got[rule][x] for x in ("steps", "forecast", "psnr")} for rule in RULES}})
            progress.step(f"run {r} K = {k}: instant {got['instant']['psnr']:.2f}, checked ({len(checked)} "
                          f"candidates) {got['checked']['psnr']:.2f}, at io share {a.io_share} ({len(at_io)}) "
                          f"{got['checked_io']['psnr']:.2f}, best {got['best']['psnr']:.2f} dB")
        runs.append(run)
        per_run.append(values)
    ks_out = []
    for k in a.ks:
        ks_out.append({"K": k, **{rule: summary([v[k][rule] for v in per_run]) for rule in RULES},
                       "fewer_steps": round(statistics.mean(model.fewer(k)), 3)})
    out = {"model": a.model, "steps": 20, "runs": a.runs, "pairs": model.pairs, "io_share_checked": a.io_share,
           "ks": ks_out, "monotone": monotone(per_run, a.ks), "per_run": runs}
    if a.own_alpha:  # each prompt's held-out batch profiled on its own: α fitted on the very runs it is judged on
        own = {lab: profiled(f"pairs{lab}", 100 + lab, lab, a.per_label)[0] for lab in model.labels}
        n = a.per_label
        out["own_alpha"] = []
        for k in a.ks:
            prof, mask = first_masks[k]
            res = {"K": k, "steps": [i for i, v in enumerate(mask) if v]}
            for name, pol_of in (("linear", lambda lab: Policy.for_mask(prof, mask, "linear")),
                                 ("fitted_run1", lambda lab: Policy.for_mask(prof, mask, "fitted")),
                                 ("fitted_own", lambda lab: Policy.for_mask(own[lab], mask, "fitted"))):
                ps = []
                for lab in model.labels:
                    img = model.sample(applied(pol_of(lab)), 100 + lab, lab, n)
                    ps += flat_psnr(img, model.ref[lab * n:(lab + 1) * n])
                res[name] = round(statistics.mean(ps), 3)
            out["own_alpha"].append(res)
            print(f"K = {k} on run 0's instant mask: linear {res['linear']:.2f}, fitted with run 1's α "
                  f"{res['fitted_run1']:.2f}, fitted with each prompt's own α {res['fitted_own']:.2f} dB", flush=True)
    return out


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.auto_seeds"))
