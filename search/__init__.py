"""GCache search (torch/numpy/sklearn, never ComfyUI): one concept per module.

    dp.py          the exact inner DP (Algorithm 1): dp_mask(E, w, K) -> (mask, bound)
    gp.py          the outer GP-LCB proposer (Algorithm 2, Appendix D.3)
    bilevel.py     SearchConfig, run_search (resumable state file), SearchResult, SearchInterrupted
    objectives.py  make_objective("lpips_ssim" | "ssim" | "psnr"), psnr, ssim, LPIPSUnavailable
    baselines.py   uniform / TeaCache-like / local DP / theory DP policies at the same K
    plots.py       plot_search, plot_profile (Pillow images)

Modules are imported by name (e.g. `from gcache.search.bilevel import run_search`) so that importing the
package stays cheap (scikit-learn and lpips load only when used).
"""
