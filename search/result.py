"""What a search returns: SearchResult, and the policies of searched masks with the speed-up they predict.

`searched_policy` is the one place a policy of a searched mask is made: the policy each evaluation applies (GCache
Search's candidates), the best policy so far, and the policy the search returns. Each carries the profile's io share
and the speed-up it predicts (`IoShare.metrics`), so what Apply logs for an evaluation and what the saved policy says
are the same figure; `predicted_speedup_text` is how a search reports it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional, Sequence

from ..core import forecasters
from ..core.io_share import IoShare
from ..core.policy import Policy
from ..core.profile import Profile
from .choice import FRESH
from .config import SearchConfig
from .end_game import EndGame, check_provenance
from .instant import instant_name
from .keys import POLISH, mask_of, method_of  # noqa: F401  (method_of: what loop.py reports)
from .paired import paired_difference
from .state import SearchState


@dataclass
class SearchResult:
    policy: Policy
    best_mask: list
    best_loss: float
    mu_mask: list
    mu_loss: float
    s_best: list           # s of the chosen policy
    s_mu: list
    history: list
    state: SearchState
    evaluations: int       # calls of evaluate() (distinct masks), the final one included
    unchecked: bool = False  # a searched mask won without a check of its gain against the seed noise
    end: Optional[EndGame] = None  # what the end game found (end_game.py): the check, the fresh seeds' finalists


def searched_policy(profile: Profile, mask: Sequence[int], forecaster: str, method: str,
                    provenance: Optional[dict] = None, metrics: Optional[dict] = None) -> Policy:
    """The policy that applies `mask` with `forecaster` on the profile's steps (its parameters fitted to the mask),
    with the profile's io share and predicted speed-up in its metrics (after `metrics`)."""
    mask = [int(v) for v in mask]
    share = profile.io.metrics(len(mask), sum(mask))
    return Policy.for_mask(profile, mask, forecaster, method=method, provenance=dict(provenance or {}),
                           metrics={**(metrics or {}), **share})


def predicted_speedup_text(policy: Policy) -> str:
    """'predicted 2.04× (1.98–2.10)' from the policy's own metrics: what the search reports of the policy it saves,
    computed as Apply computes it for a run under that policy."""
    return IoShare.from_metrics(policy.metrics, 0.0).describe_speedup(policy.n_steps, policy.n_computed)


def build(state: SearchState, profile: Profile, config: SearchConfig, end: EndGame) -> SearchResult:
    """The result of a finished search: the policy of the candidate its end game chose (end_game.py), with its
    provenance and its loss minus the instant policy's, paired over the seeds."""
    hist, fin, masks = state.history, state.final, state.masks
    best = state.best()
    own = instant_name("theory", config.forecast)  # the instant policy of the same forecaster
    theory = next((h for h in hist if h.get("method") == own), None)
    final, fc_name = end.final, end.final.forecaster
    measured = final.measured.losses()
    searched_with = forecasters.get(config.forecast).name
    s_chosen = None if final.s is None else [float(v) for v in final.s]
    prov = json.loads(json.dumps(state.provenance))  # the policy's own copy
    prov.update({"s": s_chosen, "degree": config.degree, "objective": config.objective, "chosen": end.how,
                 "won": final.method, "iterations": len(hist), "evaluations": len(masks),
                 "search_seed": config.seed, "s_range": [config.s_min, config.s_max], "profile": dict(state.profile_id),
                 "state": state.search_id,
                 "polish": {"moves": sum(h["kind"] == POLISH for h in hist),
                            "accepted": sum(bool(h.get("accepted")) for h in hist), "guard": state.polish.guard}})
    metrics = {"loss": measured["loss"], "objective": config.objective, "mu_loss": fin["loss"],
               "best_loss": best["loss"]}
    if theory is not None:
        metrics["instant_loss"] = theory["loss"]
        vs = paired_difference(measured.get("per_seed"), masks[theory["mask"]].get("per_seed"))
        if vs is not None:
            metrics["loss_minus_instant"] = vs  # paired over seeds: < 0 means the search beat the instant policy
    prov["forecast"] = {"forecaster": fc_name,
                        "chosen_by": "fresh seeds" if end.how == FRESH else
                        "forecaster check" if fc_name != end.check.checked.forecaster else
                        ("search config" if fc_name == searched_with else "search")}
    checked = check_provenance(end.check)
    if checked:
        prov["forecast"]["check"] = checked
    fresh = end.fresh.provenance() if end.fresh is not None else {}
    if fresh:
        prov["fresh_seeds"] = fresh  # the final choice on fresh seeds (end_game.py)
        if end.final.key in fresh.get("losses", {}):
            metrics["fresh_loss"] = fresh["losses"][end.final.key]
    policy = searched_policy(profile, final.mask, fc_name, "gcache", prov, metrics)
    return SearchResult(policy=policy, best_mask=mask_of(best["mask"]), best_loss=best["loss"],
                        mu_mask=mask_of(fin["mask"]), mu_loss=fin["loss"], s_best=s_chosen,
                        s_mu=[float(v) for v in fin["s"]], history=list(hist), state=state,
                        evaluations=len(masks), unchecked=end.choice.unchecked, end=end)
