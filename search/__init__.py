"""GCache search (torch/numpy/sklearn, never ComfyUI): one concept per module.

The algorithm, in the order a search uses it:

    config.py            SearchConfig: what one search is (K < N, the GP's settings, the forecaster, the polish)
    budget.py            how the budget splits into phases, and the least useful budget: the one place they're computed
    error_models.py      the error tensors a DP picks masks from (mean |error|, RMS, least-squares RMS, reuse), by name
    dp.py                the exact inner DP (Algorithm 1): dp_mask(E, w, K) -> (mask, bound)
    dp_forecast.py       the same DP for masks applied with two-step forecasts
    instant.py           instant policies: the DP under analytic weights (theory, local, given s); auto's forecaster
    baselines.py         uniform / TeaCache-like / local DP / theory DP policies at the same K
    starts.py            the search's start masks (instant DP masks of every error model, TeaCache-like, extras)
    gp.py                the outer GP-LCB proposer (Algorithm 2, Appendix D.3), GP-BUCB pending points
    polish.py            the polish stage: local moves of the best mask on the true loss, kept by a guard
    paired.py            paired statistics over the seeds: the rules (polish guards, final choice, forecaster check,
                         fresh seeds), their z values and the stored measurements behind them, the guard names
    choice.py            which measured mask a search returns (never worse than its best start mask on its loss)
    end_game.py          after the budget: the candidate, the forecaster check, the final choice on fresh seeds
    state.py             the resumable state file: read-only accessors, every write a method of SearchState
    executor.py          where evaluations run and what they can evaluate (Executor, InProcessExecutor)
    loop.py              SearchLoop: one search, one method per phase; run_search, run_batch_search
    result.py            SearchResult, the policy the end game chose, and the policies of searched masks with their
                         predicted speed-up

The infrastructure around it (infra/): what runs evaluations elsewhere, scores images, and talks to people.

    infra/parallel.py          ThreadExecutor: evaluations on threads
    infra/ray_executor.py      RayExecutor: evaluations on Ray actors (optional extra)
    infra/comfyui_worker.py    a search worker that drives a ComfyUI server through its HTTP API
    infra/objectives.py        make_objective("lpips_ssim" | "ssim" | "psnr"), psnr, ssim, LPIPSUnavailable
    infra/backbone_download.py LPIPS's AlexNet weights, fetched on first use
    infra/plots.py             plot_search, plot_policy, plot_profile (Pillow images)
    infra/cli.py               what the command-line tools share: seed lists, thread pinning, argument checks
    infra/requirements.py      the optional packages a search needs, checked before it starts

The algorithm never imports infra/ (tests/test_search_layers.py). Modules are imported by name (e.g.
`from gcache.search.loop import run_search`) so that importing the package stays cheap (scikit-learn and lpips load
only when used).
"""
