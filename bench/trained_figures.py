"""The ComfyUI figures first measured on random-weight tiny models, again on the two trained tiny models (issue 42,
item 3): composition, the self-check's margin, auto's predicted against measured speed-up, and the few-steps case.

The models are comfy_models/'s trained Flux-class and Wan 2.1-class files, loaded as bench/peers.py loads them, and
sampled as it samples them: through ComfyUI's nodes in this process (GCache Apply's execute(), KSampler's
common_ksampler; Flux: euler / simple, CFG 3.5; Wan: uni_pc / simple, CFG 5), on a few held-out seed x prompt pairs
(seed s, prompt s mod classes). GCache is Apply (auto) at 2x, after its run 1 (a full-compute profiling run on a seed
outside the held-out pairs; run 1 also self-checks the skip path). Per family:

- selfcheck: run 1's verdict from the gcache folder's selfcheck.json: the replay error, its tolerance, and the margin
  tolerance / error (how many times the error fits under the tolerance);
- speedup: the speed-up auto predicted (the saved policy's K of N at its measured io share: N / (K + (N - K) io))
  against the measured ones: whole runs' wall clock (median over the pairs of plain / auto) and the per-run figure
  GCache's log line gives (median over the pairs);
- composition: X = Skip Layer Guidance (SkipLayerGuidanceDiT, scale 3, on the stack's middle block, every step) and
  PerpNegGuider (negative: another class's prompt, empty: the empty prompt, neg scale 1); per pair the relative L2
  distance of the final latents of GCache + X from plain + X, and its ratio to GCache's own distance from plain (the
  ratio bench/composition.py reports on random weights; its rule: at most 3);
- few_steps: at each --few-steps N, auto at 2x (after its own run 1 at N steps) against plain at N steps, and a plain
  run of K steps (K: the steps auto computed), PSNR of the decoded pixels against the N-step run.

    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.bench.trained_figures [--seeds 4] [--few-steps 8 6]

Ends with one JSON line.
"""
from __future__ import annotations

import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time

from .cli import BenchParser, Progress, require_comfyui, run_main, whole
from .peers import PROFILE_SEED, SETTINGS

TARGET = 2.0
FACTOR = 3.0  # bench/composition.py's rule
SLG_MIDDLE = {"flux": ("", "1"), "wan": ("2", "")}  # (double, single) layers: the middle of 2 + 4 and of 4 blocks
LOG_LINE = re.compile(r"^GCache: computed (\d+)/(\d+) steps.*?predicted ([\d.]+)×.*?measured ([\d.]+)×")


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.trained_figures", __doc__)
    ap.add_argument("--seeds", type=whole(1), default=4, help="held-out seed x prompt pairs (seed s, prompt s mod "
                                                              "classes)")
    ap.add_argument("--steps", type=whole(4), default=20)
    ap.add_argument("--few-steps", nargs="+", type=whole(2), default=[8, 6], metavar="N")
    ap.add_argument("--families", nargs="+", default=["flux", "wan"], choices=("flux", "wan"))
    ap.add_argument("--models", default=None, help="folder of <family>_tiny.safetensors (default: comfy_models/)")
    a = ap.parse_args(argv)
    require_comfyui(ap)
    import torch

    from ..comfy_models import families
    families.use_comfyui()
    torch.set_num_threads(1)
    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False
    out = {"steps": a.steps, "target": TARGET, "held_out_pairs": a.seeds, "few_steps": a.few_steps, "factor": FACTOR,
           "comfyui": families.comfyui_version(), "families": {}}
    progress = Progress(len(a.families) * (4 + len(a.few_steps)), "trained figures: parts",
                        expected_s=a.seeds * 25.0 * len(a.families))
    for name in a.families:
        out["families"][name] = Family(a, families.FAMILIES[name], progress).figures()
    print(json.dumps(out))
    return out


class LogLines(logging.Handler):
    """GCache's per-run log lines ('GCache: computed K/N steps, ... predicted X×, ... measured Y×')."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.runs = []

    def emit(self, record):
        m = LOG_LINE.match(record.getMessage())
        if m:
            self.runs.append({"computed": int(m[1]), "steps": int(m[2]), "predicted": float(m[3]),
                              "measured": float(m[4])})


def rel(a, b) -> float:
    """The relative L2 distance of a from b (bench/composition.py's)."""
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


class Family:
    def __init__(self, a, family, progress):
        from ..comfy_models.families import load
        self.a, self.family, self.progress = a, family, progress
        self.loaded = load(family, os.path.join(a.models, family.file) if a.models else None)
        self.m = self.loaded.patcher
        self.s = SETTINGS[family.name]
        self.pairs = [(seed, seed % len(family.classes)) for seed in range(a.seeds)]

    # ------------------------------------------------------------------ sampling
    def latent(self):
        import torch
        return {"samples": torch.zeros(1, *self.family.latent_shape)}

    def sample(self, model, seed, label, steps=None):
        """(final latent, seconds) of a KSampler run."""
        import nodes as comfy_nodes

        from ..comfy_models.families import comfy_cond
        t0 = time.perf_counter()
        z = comfy_nodes.common_ksampler(model, seed, steps or self.a.steps, self.s["cfg"], self.s["sampler"],
                                        self.s["scheduler"], comfy_cond(self.family, label),
                                        comfy_cond(self.family, -1), self.latent())[0]["samples"]
        return z, time.perf_counter() - t0

    def perpneg(self, model, seed, label):
        """A run with ComfyUI's PerpNegGuider (negative: the next class's prompt; empty: the empty prompt)."""
        import comfy.sample
        import comfy.samplers
        import torch
        from comfy_extras.nodes_perpneg import Guider_PerpNeg

        from ..comfy_models.families import comfy_cond
        guider = Guider_PerpNeg(model)
        guider.set_conds(comfy_cond(self.family, label),
                         comfy_cond(self.family, (label + 1) % len(self.family.classes)), comfy_cond(self.family, -1))
        guider.set_cfg(self.s["cfg"], 1.0)
        lat = self.latent()["samples"]
        # KSampler's sigmas (uni_pc drops the penultimate one), so that auto applies the policy of the KSampler runs
        drop = self.s["sampler"] in comfy.samplers.KSampler.DISCARD_PENULTIMATE_SIGMA_SAMPLERS
        sigmas = comfy.samplers.calculate_sigmas(model.get_model_object("model_sampling"), self.s["scheduler"],
                                                 self.a.steps + drop)
        if drop:
            sigmas = torch.cat([sigmas[:-2], sigmas[-1:]])
        return guider.sample(comfy.sample.prepare_noise(lat, seed), lat,
                             comfy.samplers.sampler_object(self.s["sampler"]),
                             sigmas, disable_pbar=True, seed=seed)

    def pixels(self, z):
        """Decoded pixels in [0, 1] as (frames, 3, H, W): PSNR per frame (bench/peers.py's)."""
        from ..comfy_models import data
        px = data.decode(self.m.model.process_latent_in(z))[0].clamp(-1, 1) * 0.5 + 0.5
        frames = px.unsqueeze(1) if px.dim() == 3 else px
        return frames.permute(1, 0, 2, 3)

    def auto(self, model=None):
        from ..nodes.apply_node import GCacheApply
        return GCacheApply.execute(model if model is not None else self.m, "(auto)", "model device", "remap",
                                   TARGET).result[0]

    # ------------------------------------------------------------------ the figures
    def figures(self) -> dict:
        import folder_paths
        logger = logging.getLogger("gcache")
        lines = LogLines()
        old_level = logger.level
        logger.addHandler(lines)
        logger.setLevel(logging.INFO)
        old = folder_paths.folder_names_and_paths.get("gcache")
        try:
            with tempfile.TemporaryDirectory(prefix="gcache-trained-") as gdir:
                folder_paths.folder_names_and_paths["gcache"] = ([gdir], {".json", ".safetensors"})
                out = {"settings": {**self.s, "steps": self.a.steps, "loaded_by": self.loaded.path},
                       "pairs": self.pairs}
                out.update(self.main_steps(gdir, lines))
                out["few_steps"] = [self.few(n, gdir, lines) for n in self.a.few_steps]
        finally:
            logger.removeHandler(lines)
            logger.setLevel(old_level)
            if old is None:
                folder_paths.folder_names_and_paths.pop("gcache", None)
            else:
                folder_paths.folder_names_and_paths["gcache"] = old
        return out

    def run_one(self, make, lines):
        """(latent, seconds, GCache's log line of the run or None)."""
        before = len(lines.runs)
        z, secs = make()
        return z, secs, (lines.runs[-1] if len(lines.runs) > before else None)

    def main_steps(self, gdir, lines) -> dict:
        from ..core.io_share import IoShare
        from ..core.policy import Policy
        from ..search.infra.objectives import psnr
        fam, n = self.family.name, self.a.steps
        # auto's run 1: every step computed, profiled and self-checked (a seed outside the held-out pairs)
        self.sample(self.auto(), PROFILE_SEED, 0)
        selfcheck = self.verdict(gdir)
        self.progress.step(f"{fam} run 1: self-check {selfcheck['result']}, error {selfcheck['error']:.3g}, "
                           f"tolerance {selfcheck['tolerance']:.3g}")
        plain, auto = [], []
        for seed, lab in self.pairs:
            plain.append(self.sample(self.m, seed, lab))
            auto.append(self.run_one(lambda: self.sample(self.auto(), seed, lab), lines))
        if any(r[2] is None for r in auto):
            raise RuntimeError(f"{fam}: a GCache Apply (auto) run logged no 'GCache: computed …' line")
        pol_file = [f for f in os.listdir(gdir) if f.endswith(f"_{TARGET:g}x.json")]
        if len(pol_file) != 1:
            raise RuntimeError(f"{fam}: auto saved {pol_file} for {TARGET:g}x, not one policy")
        pol = Policy.load(os.path.join(gdir, pol_file[0]))
        share = IoShare.from_metrics(pol.metrics, 0.0)
        predicted, lo, hi = share.speedup(pol.n_steps, pol.n_computed)
        ratios = [p[1] / g[1] for p, g in zip(plain, auto)]
        speedup = {"n": pol.n_steps, "k": pol.n_computed, "io_share": round(share.value, 5),
                   "predicted": round(predicted, 3),
                   "predicted_range": None if lo is None else [round(lo, 3), round(hi, 3)],
                   "logged_predicted": [r[2]["predicted"] for r in auto],
                   "logged_measured": [r[2]["measured"] for r in auto],
                   "computed": [r[2]["computed"] for r in auto],
                   "measured_wall": round(statistics.median(ratios), 3), "wall_per_pair": [round(x, 3) for x in ratios],
                   "measured_logged": statistics.median(r[2]["measured"] for r in auto)}
        speedup["predicted_over_measured_wall"] = round(predicted / speedup["measured_wall"], 3)
        quality = [round(psnr(self.pixels(g[0]), self.pixels(p[0])), 3) for p, g in zip(plain, auto)]
        self.progress.step(f"{fam} auto {TARGET:g}x: K = {pol.n_computed} of {n}, predicted {predicted:.2f}x, measured "
                           f"{speedup['measured_wall']:.2f}x (wall), {speedup['measured_logged']:.2f}x (log line); "
                           f"PSNR vs plain {statistics.mean(quality):.2f} dB")
        base = [rel(g[0], p[0]) for p, g in zip(plain, auto)]
        comp = {"gcache_vs_plain": [round(x, 5) for x in base], "psnr_gcache_vs_plain": quality, "rows": []}
        for x, with_x in self.compositions():
            d, dpsnr, computed = [], [], []
            for (seed, lab), b in zip(self.pairs, base):
                zx = with_x(self.m, seed, lab)
                zg, _, line = self.run_one(lambda: (with_x(self.auto(), seed, lab), 0.0), lines)
                if line is None:
                    raise RuntimeError(f"{fam} GCache + {x}: no 'GCache: computed …' line (GCache did not run)")
                computed.append(line["computed"])
                d.append(rel(zg, zx))
                dpsnr.append(round(psnr(self.pixels(zg), self.pixels(zx)), 3))
            row = {"x": x, "gcache_x_vs_plain_x": [round(v, 5) for v in d], "psnr": dpsnr, "computed": computed,
                   "ratio_per_pair": [round(v / b, 3) for v, b in zip(d, base)],
                   "ratio": round(statistics.mean(d) / statistics.mean(base), 3)}
            comp["rows"].append(row)
            self.progress.step(f"{fam} GCache + {x} vs plain + {x}: {statistics.mean(d):.4f} = {row['ratio']:.2f} x "
                               f"GCache vs plain ({statistics.mean(base):.4f}); PSNR {statistics.mean(dpsnr):.2f} dB")
        return {"selfcheck": selfcheck, "speedup": speedup, "composition": comp}

    def compositions(self):
        from comfy_extras.nodes_slg import SkipLayerGuidanceDiT
        double, single = SLG_MIDDLE[self.family.name]

        def slg(model, seed, lab):
            out = SkipLayerGuidanceDiT.execute(model, 3.0, 0.0, 1.0, double_layers=double, single_layers=single)
            return self.sample(out.result[0] if hasattr(out, "result") else out[0], seed, lab)[0]

        return [("SkipLayerGuidanceDiT", slg), ("PerpNegGuider", self.perpneg)]

    def verdict(self, gdir) -> dict:
        from ..nodes.artifacts import SELFCHECK_FILE
        with open(os.path.join(gdir, SELFCHECK_FILE), encoding="utf-8") as f:
            found = json.load(f)["verdicts"]
        if len(found) != 1:
            raise RuntimeError(f"{self.family.name}: run 1 left {len(found)} verdicts in {SELFCHECK_FILE}, not one")
        v = found[0]
        return {"result": v["result"], "error": v["error"], "tolerance": v["tolerance"], "dtype": v["dtype"],
                "margin": None if not v["error"] else round(v["tolerance"] / v["error"], 2)}

    def few(self, n, gdir, lines) -> dict:
        from ..search.infra.objectives import psnr
        self.sample(self.auto(), PROFILE_SEED, 0, steps=n)  # auto's run 1 at n steps
        auto, fewer, ks = [], [], []
        for seed, lab in self.pairs:
            ref = self.pixels(self.sample(self.m, seed, lab, steps=n)[0])
            z, _, line = self.run_one(lambda: self.sample(self.auto(), seed, lab, steps=n), lines)
            if line is None:
                raise RuntimeError(f"{self.family.name} auto at {n} steps: no 'GCache: computed …' line")
            k = line["computed"]
            ks.append(k)
            auto.append(round(psnr(self.pixels(z), ref), 3))
            fewer.append(round(psnr(self.pixels(self.sample(self.m, seed, lab, steps=k)[0]), ref), 3))
        row = {"n": n, "k": ks, "auto_psnr": auto, "fewer_steps_psnr": fewer,
               "auto_minus_fewer": round(statistics.mean(auto) - statistics.mean(fewer), 3)}
        self.progress.step(f"{self.family.name} {n} steps: auto {TARGET:g}x (K = {ks[0]}) {statistics.mean(auto):.2f} "
                           f"dB, {ks[0]} plain steps {statistics.mean(fewer):.2f} dB vs plain {n} steps")
        return row


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.trained_figures"))
