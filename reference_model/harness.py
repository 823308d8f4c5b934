"""Everything the demo, the search command, the benchmarks and the tests do with the reference model:
full-compute reference runs, runs under a mask, profiling, and an `evaluate(mask)` for the search.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from ..core import forecasters
from ..core.engine import CacheStats, ResidualCache
from ..core.io_share import run_summary
from ..core.policy import Policy
from ..core.profile import Profile
from ..core.recorder import ProfileRecorder
from ..core.step_clock import StackClock, StepClock
from .model import TinyDiT, load_model
from .sampler import flow_sigmas, sample, to_unit


def labels_for(seeds: Sequence[int]) -> list[int]:
    """Each seed draws digit seed % 10, so any seed list covers the classes evenly."""
    return [int(s) % 10 for s in seeds]


class ReferenceHarness:
    def __init__(self, n_steps: int = 30, cfg_scale: float = 3.0, shift: float = 2.0,
                 model: Optional[TinyDiT] = None, device: str = "cpu"):
        self.model = model if model is not None else load_model(device=device)
        self.n_steps, self.cfg_scale, self.shift = n_steps, cfg_scale, shift
        sig = flow_sigmas(n_steps, shift)
        self.sigmas = sig[:-1].tolist()
        self.times = self.sigmas  # flow matching: normalized time t = σ
        self.sigmas_with_end = sig.tolist()
        self._full_cache: dict[tuple, torch.Tensor] = {}

    @property
    def meta(self) -> dict:
        return {"model": "gcache-reference-tiny-dit-digits", "family": "reference", "sampler": "euler",
                "scheduler": f"flow_shift_{self.shift:g}", "steps": self.n_steps, "cfg": self.cfg_scale}

    def run(self, seeds: Sequence[int], mask: Optional[Sequence[int]] = None, recorder=None,
            cache_device=None, forecast="reuse", forecast_params: Optional[dict] = None
            ) -> tuple[torch.Tensor, Optional[CacheStats]]:
        """Images in [0, 1]. mask=None and no recorder: the model without GCache at all. forecast: a forecaster's
        name (core/forecasters) and its parameters (the profile-fitted one's α). Steps are timed (the stack too when
        a recorder records: the measured io share), as in ComfyUI's Apply and Profile runs."""
        if mask is None and recorder is None:
            return to_unit(sample(self.model, labels_for(seeds), seeds, self.n_steps, self.cfg_scale, self.shift)), None
        observers = (recorder, StackClock()) if recorder is not None else (StepClock(),)
        with ResidualCache(mask, cache_device=cache_device, forecast=forecast,
                           times=self.times if mask is not None else None, forecast_params=forecast_params,
                           observers=observers) as cache:
            img = sample(self.model, labels_for(seeds), seeds, self.n_steps, self.cfg_scale, self.shift, cache=cache)
        return to_unit(img), cache.stats

    def full(self, seeds: Sequence[int]) -> torch.Tensor:
        key = tuple(int(s) for s in seeds)
        if key not in self._full_cache:
            self._full_cache[key] = self.run(seeds)[0]
        return self._full_cache[key]

    def profile(self, seeds: Sequence[int], history_device=None, forecast: bool = False) -> Profile:
        """One full-compute run per seed batch; every CFG branch of every run is one sample of E (and E1)."""
        rec = ProfileRecorder(self.times, self.sigmas, self.meta, history_device=history_device, forecast=forecast)
        images, stats = self.run(seeds, mask=None, recorder=rec)
        shares = stats.io_step_shares()  # the stack timed against whole steps: the measured io share
        if shares:
            rec.meta["io_runs"] = [run_summary(shares)]
        self._full_cache.setdefault(tuple(int(s) for s in seeds), images)  # a profiled run is a full run
        return rec.finish()

    def evaluator(self, seeds: Sequence[int], objective: Callable[[torch.Tensor, torch.Tensor], float],
                  forecast="reuse", profile: Optional[Profile] = None) -> "SeedEvaluator":
        """evaluate(mask) -> the loss of each seed's image sampled under mask against its full-compute image
        (the search averages them, and compares masks seed by seed). A forecaster with parameters (profile-fitted)
        fits them to each mask from `profile`. evaluate(mask, forecast=name) applies another forecaster (the
        search's forecaster check)."""
        return SeedEvaluator(self, seeds, objective, forecast, profile)

    def held_out(self, policy: Policy, seeds: Sequence[int]) -> dict:
        """{"eval_psnr", "eval_ssim"} of `policy` (its mask, forecaster and parameters) on `seeds` against full
        compute: the held-out figures the commands report."""
        from ..search.infra.objectives import psnr, ssim
        img, _ = self.run(seeds, policy.mask, forecast=policy.forecast, forecast_params=policy.forecast_params)
        ref = self.full(seeds)
        return {"eval_psnr": psnr(img, ref), "eval_ssim": ssim(img, ref)}

    def policy_from_mask(self, mask: Sequence[int], method: str, **prov) -> Policy:
        return Policy(mask=list(mask), times=list(self.times), sigmas=list(self.sigmas), method=method,
                      provenance=dict(prov, **self.meta))


class SeedEvaluator:
    """A search's evaluate(mask) on the reference model (ReferenceHarness.evaluator). It applies any forecaster (with
    parameters fitted from the profile when it has one) and samples the fresh seeds (search/end_game.py; their
    full-compute images made on first use), so it says so to the search (search/executor.py)."""

    can_apply_forecaster = True
    can_sample_fresh = True

    def __init__(self, harness: ReferenceHarness, seeds: Sequence[int], objective, forecast="reuse",
                 profile: Optional[Profile] = None):
        self.h, self.seeds, self.objective, self.profile = harness, list(seeds), objective, profile
        self.own = forecasters.get(forecast)
        self.ref = harness.full(self.seeds)
        from ..search.end_game import fresh_seeds
        self.fresh_seeds, self.fresh_ref = fresh_seeds(self.seeds), None

    def __call__(self, mask: Sequence[int], forecast: Optional[str] = None, fresh: bool = False) -> list[float]:
        fc = self.own if forecast is None else forecasters.get(forecast)
        params = fc.fit(self.profile, list(mask)) if self.profile is not None else {}
        seeds, ref = self.seeds, self.ref
        if fresh:
            if self.fresh_ref is None:
                self.fresh_ref = self.h.full(self.fresh_seeds)
            seeds, ref = self.fresh_seeds, self.fresh_ref
        img, _ = self.h.run(seeds, mask=list(mask), forecast=fc.name, forecast_params=params)
        return [float(self.objective(img[i:i + 1], ref[i:i + 1])) for i in range(img.shape[0])]
