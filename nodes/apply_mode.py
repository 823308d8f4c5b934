"""GCache Apply's mode: sample under a policy (skip the block stack on its reuse steps). Imports ComfyUI."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

from ..core.engine import CacheStats, ResidualCache
from ..core.errors import GCacheError
from ..core.policy import FORECAST_ORDERS, Policy
from .adapters import Route
from .profile_mode import SPLITS
from .run_config import RunConfig, check_step_mismatch, where_run
from .runtime import RunState
from .steps import place_policy

log = logging.getLogger("gcache")


@dataclass
class ApplyConfig(RunConfig):
    policy: Optional[Policy] = None
    on_mismatch: str = "remap"       # "remap" | "error"
    cache_device: Optional[str] = None  # None: the model's device; "cpu"
    forecast: Optional[int] = None   # None: the policy's forecast order; 0/1/2 override it
    note: str = ""                   # what chose this policy, for the log line (auto mode)

    def start_run(self, patcher, run_sigmas: list[float], sample_key: Callable[[], str]) -> RunState:
        SPLITS.expire()  # a new prompt drops abandoned split recordings, whichever GCache node samples first
        pol = self.policy
        sched, times, tracker = where_run(patcher, run_sigmas, pol.sigmas, lambda s: pol.n_steps == s.n_run)
        placement = place_policy(pol, sched, times, self.on_mismatch)
        order = pol.forecast if self.forecast is None else self.forecast
        mask, cache_device = placement.mask, self.cache_device

        def finish(run: RunState, stats: CacheStats, ok: bool):
            self.warn_if_unpatched(run, stats)
            extra = [x for x in (self.note, placement.note,
                                 self.adapter.name if self.adapter.route == Route.FALLBACK else "",
                                 f"forecast order {order}, {order + 1} residuals kept per branch" if order else "")
                     if x]
            log.info("%s [%s, %s%s]%s", stats.summary(mask, self.io_share), self.model_name, sched.where(),
                     "".join(f"; {x}" for x in extra), "" if ok else " (sampling did not finish)")

        # forecasting in the model's normalized time of the global schedule (t = σ for flow models)
        return RunState(lambda: ResidualCache(mask, cache_device=cache_device, forecast=order, times=times), tracker,
                        self.owner, on_close=finish)


def apply_config(model, policy: Policy, on_mismatch: str = "remap", cache_device: Optional[str] = None,
                 forecast: Optional[int] = None) -> ApplyConfig:
    check_step_mismatch(on_mismatch)
    if forecast is not None and forecast not in FORECAST_ORDERS:
        raise GCacheError(f"The forecast order must be 0, 1 or 2 (or the policy's), got {forecast!r}.")
    return ApplyConfig(**RunConfig.describe(model.get_model_object("diffusion_model")), policy=policy,
                       on_mismatch=on_mismatch, cache_device=cache_device, forecast=forecast)
