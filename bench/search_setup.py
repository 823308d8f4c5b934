"""What the search benches (forecaster_check.py, polish_guard.py, polish_ceiling.py) share: their common arguments,
and their setup on the reference model — a profile of the search seeds with forecast statistics, evaluate(mask)
under the fitted forecaster with the objective 1 − SSIM, and the held-out PSNR of a mask under a forecaster.
"""
from __future__ import annotations

import argparse
from typing import Optional, Sequence


def add_arguments(ap: argparse.ArgumentParser, ks: Sequence[int] = (6, 8, 10, 15, 20), budget: int = 48,
                  gp_seeds: Optional[str] = "0-2") -> None:
    """--steps, --ks, --budget, --gp-seeds (unless None), --search-seeds, --eval-seeds, --threads, each checked by
    its type (bench/cli.py: a bad value ends the command in one line before any work)."""
    from .cli import seed_text, whole
    ap.add_argument("--steps", type=whole(4), default=30)
    ap.add_argument("--ks", type=whole(2), nargs="+", default=list(ks))
    ap.add_argument("--budget", type=whole(1), default=budget)
    if gp_seeds is not None:
        ap.add_argument("--gp-seeds", type=seed_text, default=gp_seeds)
    ap.add_argument("--search-seeds", type=seed_text, default="1000-1015")
    ap.add_argument("--eval-seeds", type=seed_text, default="0-15")
    ap.add_argument("--threads", type=whole(1), default=1)


def check_ks(ap, a) -> None:
    """Every K below --steps (ap.error otherwise: before the model loads)."""
    bad = [k for k in a.ks if k >= a.steps]
    if bad:
        ap.error(f"--ks {' '.join(map(str, bad))}: K must be below --steps {a.steps} (K = N computes every step)")


class FittedSetup:
    """The reference model (or `harness_factory(steps)`'s), profiled on the search seeds; `evaluate` is the fitted
    search's evaluation; `held_out(mask, forecaster)` the PSNR in dB (3 decimals) on the held-out seeds."""

    def __init__(self, a: argparse.Namespace, harness_factory=None):
        from ..reference_model.harness import ReferenceHarness
        from ..search.infra.cli import parse_seeds, set_threads
        from ..search.infra.objectives import make_objective
        set_threads(a.threads)
        self.h = harness_factory(a.steps) if harness_factory else ReferenceHarness(a.steps)
        self.search_seeds, self.eval_seeds = parse_seeds(a.search_seeds), parse_seeds(a.eval_seeds)
        self.gp_seeds = parse_seeds(a.gp_seeds) if getattr(a, "gp_seeds", None) else []
        self.profile = self.h.profile(self.search_seeds, forecast=True)
        self.evaluate = self.h.evaluator(self.search_seeds, make_objective("ssim"), forecast="fitted",
                                         profile=self.profile)
        self.ref = self.h.full(self.eval_seeds)

    def held_out(self, mask, forecaster: str = "fitted", params: Optional[dict] = None) -> float:
        """`mask`: 0/1 values, or a search's candidate key (search/state.py: "1001…@l2p" applies l2p, a bare mask
        `forecaster`); `params` None: fitted to the mask from the profile."""
        from ..core import forecasters
        from ..search.infra.objectives import psnr
        from ..search.state import forecaster_of, mask_of
        if isinstance(mask, str):
            mask, forecaster = mask_of(mask), forecaster_of(mask, forecaster)
        fc = forecasters.get(forecaster)
        mask = [int(c) for c in mask]
        img, _ = self.h.run(self.eval_seeds, mask, forecast=fc.name,
                            forecast_params=fc.fit(self.profile, mask) if params is None else params)
        return round(psnr(img, self.ref), 3)
