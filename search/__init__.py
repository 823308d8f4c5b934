"""GCache search (torch/numpy/sklearn, never ComfyUI): one concept per module.

    dp.py                the exact inner DP (Algorithm 1): dp_mask(E, w, K) -> (mask, bound)
    dp_forecast.py       the same DP for masks applied with order-1 forecasting (E1)
    gp.py                the outer GP-LCB proposer (Algorithm 2, Appendix D.3), GP-BUCB pending points
    instant.py           instant policies: the DP under analytic weights (theory, local, given s)
    baselines.py         uniform / TeaCache-like / local DP / theory DP policies at the same K
    error_models.py      the error tensors a DP picks masks from (mean |error|, RMS, least-squares RMS, reuse), by name
    config.py            SearchConfig: what one search is, and how its budget splits into phases
    starts.py            the search's start masks (instant DP masks of every error model, TeaCache-like, extras)
    bilevel.py           the search loop (run_search; run_batch_search with q in flight), SearchResult
    polish.py            the polish stage: local moves of the best mask on the true loss, with a guard on the seeds
    choice.py            which measured mask a search returns (never worse than its best start mask on its loss)
    forecaster_check.py  the chosen mask under the other profile-fitted forecasters: which one the policy applies
    state.py             the search's resumable state file (SearchState, load_state)
    parallel.py          run_search_parallel and ThreadExecutor: several evaluations in flight
    ray_executor.py      RayExecutor: evaluations on Ray actors (optional extra)
    comfyui_worker.py    a search worker that drives a ComfyUI server through its HTTP API
    objectives.py        make_objective("lpips_ssim" | "ssim" | "psnr"), psnr, ssim, LPIPSUnavailable
    backbone_download.py LPIPS's AlexNet weights, fetched on first use
    plots.py             plot_search, plot_policy, plot_profile (Pillow images)
    cli.py               what the command-line tools share: seed lists, thread pinning
    requirements.py      the optional packages a search needs, checked before it starts (how to install them)

Modules are imported by name (e.g. `from gcache.search.bilevel import run_search`) so that importing the
package stays cheap (scikit-learn and lpips load only when used).
"""
