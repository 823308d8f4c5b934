"""The blocks bench/render_docs.py writes into README.md and docs/: tables, commands and sentences with figures, each
from the stored results (bench/results/<run>.json) named in it. A block reads a result's JSON line as its bench
printed it; a figure a block computes (a difference, a range) is computed here from those, never typed."""
from __future__ import annotations

import math
import os
import re

from .doc_text import BLOCKS, RenderError, block, db, fenced, joined, num, table

GIB = 2 ** 30
MIB = 2 ** 20


def pct(v, spec: str = "+.2f") -> str:
    return num(100 * v, spec) + " %"


def span(values, spec: str = ".2f", unit: str = "") -> str:
    """'a–b' (or 'a' when they are equal), minus signs included."""
    lo, hi = min(values), max(values)
    a, b = num(lo, spec), num(hi, spec)
    dash = lo >= 0 and "+" not in spec  # 1.2–3.4, but −1.2 to +3.4 (a dash beside signs reads as a minus)
    return (a if a == b else f"{a}–{b}" if dash else f"{a} to {b}") + unit


def machine(record: dict) -> str:
    m = record.get("machine") or {}
    if m.get("gpu"):
        return m["gpu"] if isinstance(m["gpu"], str) else ", ".join(m["gpu"])
    threads = m.get("omp_num_threads")
    return "a CPU" + (", one thread" if threads in ("1", None) else f", {threads} threads")



# ------------------------------------------------------------------------------------------------ README, nodes.md
def demo_log_line(results) -> str:
    line = next((ln for ln in results("demo")["stdout"] if ln.startswith("log ")), None)
    if line is None:
        raise RenderError("the demo's stored output has no 'log' line")
    return re.sub(r"\s+\(the line GCache Apply logs.*\)$", "", line[len("log"):].strip())


@block("readme.log_line")
def readme_log_line(results) -> str:
    return fenced(demo_log_line(results))


@block("readme.demo_caption")
def readme_demo_caption(results) -> str:
    rec, res = results.record("demo"), results("demo")
    pol, m = res["policy"], res["policy"]["metrics"]
    n, k = len(pol["mask"]), sum(pol["mask"])
    pairs = re.search(r"median of (\d+) full/GCache run pairs", "\n".join(res["stdout"]))
    lo, hi = m["measured_speedup_range"]
    plo, phi = m["predicted_speedup_range"]
    return (f"\n*The bundled reference model (a small class-conditional DiT trained on digits), {len(m['eval_seeds'])} "
            f"held-out seeds: every step computed (top) vs GCache computing {k} of {n} steps (bottom). PSNR "
            f"{num(m['psnr'], '.2f')} dB against full compute; {num(m['measured_speedup'], '.2f')}× faster (median of "
            f"{pairs.group(1) if pairs else 'the'} alternating full/GCache run pairs, "
            f"{num(lo, '.2f')}–{num(hi, '.2f')}×) where {num(m['predicted_speedup'], '.2f')}× was predicted "
            f"({num(plo, '.2f')}–{num(phi, '.2f')}×), on {machine(rec)}, {str(rec['date'])[:10]}: what the demo above "
            "prints and draws.*\n")


def paired_fresh_z() -> float:
    """The search's own margin on the fresh seeds (the rule the stored result names z=<it>)."""
    from ..search.paired import FRESH_Z
    return FRESH_Z


@block("fresh_choice.prose")
def fresh_choice_prose(results) -> str:
    """The final choice's margin against the other rules (bench/fresh_choice.py), as search.md quotes it."""
    res = results("fresh_choice")
    rules = res["rules"]

    def one(name):
        r = rules[name]
        return (f"{name}: mean {num(r['mean_regret_db'], '.2f')}, worst {num(r['worst_regret_db'], '.2f')} dB, "
                f"{r['replaced']} replacements")
    ours, runs = f"z={paired_fresh_z():g}", [r for r in res["runs"] if r.get("picks")]

    def against(name):  # the search's rule against another, search by search (a tie: the same regret)
        d = [r["picks"][ours]["regret_db"] - r["picks"][name]["regret_db"] for r in runs]
        return (f"{name}: better in {sum(v < 0 for v in d)}, worse in {sum(v > 0 for v in d)}, tied in "
                f"{sum(v == 0 for v in d)}")
    return (f"over {res['searches']} searches (budget {res['budget']}, {len(res['seed_sets'])} sets of search seeds, "
            f"GP seeds {joined(res['gp_seeds'], sep=', ')}), the held-out regret against the best finalist was "
            + "; ".join(one(n) for n in rules)
            + f" (the search's {ours} against " + "; ".join(against(n) for n in rules if n != ours) + ")")


@block("readme.peers_caption")
def readme_peers_caption(results) -> str:
    """README's first figure (bench/peers_plot.py draws it from the same result): what it shows, its axis, and how
    auto's fixed-K rows fare against the best alternative at the same speed-up on both axes."""
    res = results("peers")
    fam = res["families"]["flux"]
    st = fam["settings"]  # sampler, scheduler, CFG: in docs/trained-models.md (README's size)
    ks = [r["k"] for r in fam["rows"] if r["kind"] == "gcache k"]

    def tally(axis):
        hs = [h for h in fam["headline"][axis] if h["kind"] == "gcache k" and h["psnr_diff"] is not None]
        ahead, behind = sum(h["interval"][0] > 0 for h in hs), sum(h["interval"][1] < 0 for h in hs)
        beyond = f", beyond all at {len(ks) - len(hs)}" if len(hs) < len(ks) else ""
        return f"ahead at {ahead}, level at {len(hs) - ahead - behind}, behind at {behind}{beyond}"
    return (f"\n*Auto at K = {min(ks)}–{max(ks)} of {st['steps']} beside EasyCache and LazyCache (default window; "
            f"start 0, end 1) and fewer steps: tiny Flux-class model trained here, ComfyUI {res['comfyui']}, PSNR vs "
            f"all steps, {res['held_out_pairs']} held-out pairs. X axis: block-stack passes; there, against the best "
            f"alternative, auto is {tally('passes')} of {len(ks)} K. With the io layers a skip still runs "
            f"(r = {num(fam['io_share'], '.2f')} here, ~1 % on real models): {tally('io')} "
            "([per K](docs/trained-models.md)).*\n")


@block("readme.io_example")
def readme_io_example(results) -> str:
    m = results("demo")["policy"]["metrics"]
    mask = results("demo")["policy"]["mask"]
    n, k = len(mask), sum(mask)
    r = m["io_share"]
    return (f"In the headless demo ([below](#try-it-without-comfyui)) N = {n}, K = {k} and the io share measured while "
            f"profiling, {num(r, '.3f')}, give {n} / ({k} + {n - k} × {num(r, '.3f')}) = "
            f"{num(n / (k + (n - k) * r), '.2f')}× rather than {n} / {k} = {num(n / k, '.2f')}×; a real model at a "
            f"real size has a smaller io share (Flux-dev at 1024² on a GPU: {gpu_io_share(results, 'flux')}, "
            "[benchmarks](docs/benchmarks.md#speed-and-memory)).")


def gpu_io_share(results, model: str) -> str:
    row = next(r for r in results("gpu_check")["models"] if r["model"] == model)
    return f"T_io / T = {num(100 * row['T_io_ms'] / row['T_ms'], '.1f')} %"


@block("readme.demo_seconds")
def readme_demo_seconds(results) -> str:
    wall = results.record("demo")["wall_s"]
    return f"about {5 * math.ceil(wall / 5):.0f} s"


@block("nodes.predicted")
def nodes_predicted(results) -> str:
    m = re.search(r"predicted [^,]*?\)", demo_log_line(results))
    return f"`{m.group(0)}`"


@block("nodes.wan_memory")
def nodes_wan_memory(results) -> str:
    row = next(r for r in results("memory_formula")["memory_formula"] if r["model"] == "wan" and r["N"] == 50)
    return (f"{num(row['profile']['total'] / GIB, '.2f')} GiB instead of "
            f"{num(row['profile_unsampled']['total'] / GIB, '.2f')} GiB")


# ------------------------------------------------------------------------------------------------ benchmarks.md
SCRIPTS = [  # script, what it measures, its run in bench/runs.py (or its duration), needs
    ("bench/engine.py", "the engine's cost on the reference model: all-ones overhead, speed-up at K = N/2 against the "
     "ideal, Profile memory", "engine", ""),
    ("bench/speed.py", "the same on Flux-dev- and Wan-2.1-shaped transformers, at small sizes on the CPU or real sizes "
     "on a GPU; `--memory-formula`: Profile's memory at real sizes", "speed_quick", ""),
    ("bench/dp_speed.py", "how long an instant policy's DP takes", "dp_speed", ""),
    ("bench/quality.py", "quality at equal K: GCache's instant policies, forecasters and search against uniform and "
     "TeaCache-like masks and rival forecasters", "quality_quick", ""),
    ("bench/auto_error_models.py", "which error model's mask auto applies its forecaster on", "auto_error_models", ""),
    ("bench/auto_ranking.py", "how well auto's predictions rank (mask, forecaster) pairs by measured quality, and "
     "what auto's true-loss check picks, on the reference model and the trained tiny models", "auto_ranking", ""),
    ("bench/auto_seeds.py", "what GCache Apply (auto) gives over several run-1 inputs of the trained tiny models: "
     "instant, checked, the best candidate, fewer steps", "auto_seeds_wan", "ComfyUI"),
    ("bench/l2p_keeps.py", "how many residuals the l2p forecaster keeps", "l2p_keeps", ""),
    ("bench/few_steps.py", "caching against simply sampling fewer steps, at 4 to 30 steps and 2× to 5×", "few_steps",
     ""),
    ("bench/polish_guard.py", "which polish moves the search keeps", "polish_guard_48", ""),
    ("bench/forecaster_check.py", "when the search's forecaster check switches forecaster", "forecaster_check", ""),
    ("bench/fresh_choice.py", "how clearly a finalist must beat the search's pick on fresh seeds to replace it", 30,
     ""),
    ("bench/polish_split.py", "the share of the budget the polish stage gets", 50, ""),
    ("bench/polish_ceiling.py", "what any polish move could gain from the searched mask", 6, ""),
    ("bench/cluster.py", "the search on 2 Ray workers against the sequential search: speed and quality", "cluster_64",
     "Ray"),
    ("bench/route_quality.py", "block-stack caching against the whole-model fallback", "route_quality", "ComfyUI"),
    ("bench/selfcheck_margins.py", "the self-check's margins on correct models, per family and dtype",
     "selfcheck_margins", "ComfyUI"),
    ("bench/peers.py", "GCache Apply (auto) beside every alternative (ComfyUI's EasyCache and LazyCache at two "
     "windows, plain sampling with fewer steps) on the trained tiny Flux and Wan", "peers", "ComfyUI"),
    ("bench/trained_figures.py", "composition, the self-check's margin, auto's predicted speed-up and the few-steps "
     "case on the trained tiny Flux and Wan", "trained_figures", "ComfyUI"),
    ("bench/composition.py", "GCache beside Skip Layer Guidance, PerpNeg/DualCFG, CFGZeroStar/APG and other nodes' "
     "patches, against those nodes alone", "composition", "ComfyUI"),
    ("bench/speedup_prediction.py", "predicted against measured speed-up, over reruns", "speedup_prediction",
     "ComfyUI for the tiny Flux and Wan"),
    ("bench/recorder.py", "the profile recorder's cost per step, this tree against another git revision", 2, "git"),
    ("bench/gpu_check.sh", "the prepared GPU check: `bench/speed.py` at real sizes and the real-ComfyUI suite on cuda",
     "gpu_check", "a GPU"),
]


@block("bench.scripts")
def bench_scripts(results) -> str:
    from .runs import RUNS
    rows = []
    for script, what, run, needs in SCRIPTS:
        minutes = RUNS[run].minutes if isinstance(run, str) else run
        where = " on a GPU" if needs == "a GPU" else ""
        rows.append((f"`{script}`", what, f"about {num(minutes, 'g')} min{where}", needs or "—"))
    return table(["script", "measures", "duration", "needs"], rows)


@block("engine.table")
def engine_table(results) -> str:
    res = results("engine")
    rows = []
    for n, r in res["by_n"].items():
        rows.append((n, r["K"], f"{num(1e3 * r['plain_s'], '.0f')} ms", pct(r["overhead_all_ones"]),
                     f"{num(r['speedup_half'], '.3f')}×", f"{num(r['ideal_half'], '.3f')}×",
                     num(r["speedup_ratio"], ".3f"), f"{num(r['profile_peak_extra_mb'], '.2f')} MiB"))
    return table(["N", "K", "plain run", "all-ones overhead (goal ≤ 3 %)", "speed-up at K = N/2", "ideal",
                  "ratio (goal ≥ 0.9)", "Profile peak extra"], rows)


@block("engine.prose")
def engine_prose(results) -> str:
    rec, res = results.record("engine"), results("engine")
    step_ms = min(r["plain_s"] / r["N"] for r in res["by_n"].values()) * 1e3
    io = [r["io_share"] for r in res["by_n"].values()]
    return (f"{str(rec['date'])[:10]}, {machine(rec)}. The engine's own cost of an all-ones step, timed in the same "
            f"script over 1,000 calls, is {num(res['engine_us_per_step'], '.1f')} µs = "
            f"{num(100 * res['engine_share_of_step'], '.3f')} % of a {num(step_ms, '.1f')} ms step: the run-level "
            f"overhead is run-to-run noise. Here T_io / T = {span(io, '.3f')}.")


@block("speed_quick.prose")
def speed_quick_prose(results) -> str:
    rec, models = results.record("speed_quick"), results("speed_quick")["models"]
    by = {m["model"].split("-")[0]: m for m in models}
    ratios = [m[k] for m in models for k in ("speedup_ratio_half", "speedup_ratio_third")]
    met = all(m.get("profile_formula_met") for m in models)
    return (f"{str(rec['date'])[:10]}, {machine(rec)}, `--quick`: all-ones overhead "
            + ", ".join(f"{pct(by[f]['overhead_all_ones'])} ({f})" for f in by)
            + f" (random-order single steps); speed-up against the ideal {span(ratios, '.3f')} at K = N/2 and N/3 "
            f"(goal ≥ 0.95); Profile's whole-run overhead per step "
            + ", ".join(f"{pct(by[f]['profile_step_overhead'])} ({f})" for f in by)
            + ". Apply's cache held one residual per branch ("
            + ", ".join(f"{num(by[f]['apply_cache_gb'] * 1e9 / MIB, '.3f')} MiB ({f})" for f in by)
            + "), and the profile's measured peak extra lay "
            + ("within" if met else "outside")
            + " the formula's range (what the recorder holds, up to its upper bound) for "
            + ("both models." if met else "at least one model."))


def gpu_formula(row: dict) -> dict:
    """The memory formula for a GPU run's model at its real size (bench/speed_models.py FULL), N = its steps."""
    from .speed_harness import predicted_profile_bytes
    from .speed_models import FULL
    size = FULL[row["model"].split("-")[0]]
    if row["model"].startswith("flux"):
        numel, branches = (size.lat_h // 2) * (size.lat_w // 2) * size.width, 1
    else:
        numel, branches = size.frames * (size.lat_h // 2) * (size.lat_w // 2) * size.width, 2
    itemsize = {"bfloat16": 2, "float16": 2, "float32": 4}[row["dtype"]]
    return predicted_profile_bytes(numel, itemsize, row["steps"], branches, width=size.width)


@block("gpu_check.when")
def gpu_check_when(results) -> str:
    rec, res = results.record("gpu_check"), results("gpu_check")
    models = res["models"]
    return (f"{str(rec['date'])[:10]}, commit {str(rec.get('git_commit'))[:7]}, "
            f"{res['machine'][1].split(',')[0]}, {res['machine'][2]}, "
            f"{models[0]['dtype']}, N = {models[0]['steps']} steps, "
            + ", ".join(f"{m['reps']} repetitions ({m['model']})" for m in models) + gpu_check_age(rec) + ":")


def gpu_check_age(rec: dict) -> str:
    """A GPU run can't be repeated on every change (this project's machines have no GPU): its figures stay those of
    the commit it ran at, and the docs say when the code it times has changed since."""
    from . import runs, store
    sources = runs.RUNS["gpu_check"].sources
    if store.staleness(rec, sources) is None:
        return ""
    # no count of the files changed: it would move with every change to core/ and make the docs differ
    return " (the code it times has changed since: these are that commit's figures until it runs on a GPU again)"


@block("gpu_check.table")
def gpu_check_table(results) -> str:
    names = {"flux": "Flux-dev 1024², batch 1", "wan": "Wan 2.1-1.3B 81f 480p, CFG"}
    rows = []
    for m in results("gpu_check")["models"]:
        rows.append((names.get(m["model"], m["model"]), f"{num(m['T_ms'], '.2f')} ms", f"{num(m['T_io_ms'], '.2f')} ms",
                     pct(m["overhead_all_ones"]),
                     f"{num(m['speedup_half'], '.3f')}× / {num(m['ideal_half'], '.3f')}×",
                     f"{num(m['speedup_third'], '.3f')}× / {num(m['ideal_third'], '.3f')}×",
                     pct(m["profile_step_overhead"]), f"{num(m['apply_cache_gb'] * 1e9 / MIB, '.1f')} MiB"))
    return table(["model", "T per step", "T_io", "all-ones overhead", "K = N/2: speed-up / ideal",
                  "K = N/3: speed-up / ideal", "Profile overhead per step", "Apply cache"], rows)


@block("gpu_check.memory")
def gpu_check_memory(results) -> str:
    parts = []
    for m in results("gpu_check")["models"]:
        p = gpu_formula(m)
        low, high, extra = (p["history"] + p["prev_h"]) / MIB, p["total"] / MIB, m["profile_peak_extra_gb"] * 1e9 / MIB
        kept = "every element" if p["stride"] == 1 else f"1 element in {p['stride']}"
        parts.append(f"{m['model']} {num(extra, '.1f')} MiB, {'within' if low <= extra <= high else 'outside'} the "
                     f"formula's [{num(low, '.1f')}, {num(high, '.1f')}] MiB ({kept} of the residual kept; the "
                     f"recorder's own count {num(m['recorder_peak_gb'] * 1e9 / MIB, '.1f')} MiB)")
    return "Profile's peak extra memory over an all-ones run: " + "; ".join(parts) + "."


@block("gpu_check.status")
def gpu_check_status(results) -> str:
    rec, res = results.record("gpu_check"), results("gpu_check")
    suite = [ln for ln in res.get("summary", []) if ln.startswith("comfyui")]
    ran = (f"It ran on {res['machine'][1].split(',')[0]} on {str(rec['date'])[:10]} (the figures in "
           "[speed and memory](#speed-and-memory))")
    return ran + (": " + "; ".join(suite) + "." if suite else
                  "; the real-ComfyUI suite has not run on a GPU yet (no ComfyUI tree travelled with it).")


@block("memory_formula.table")
def memory_formula_table(results) -> str:
    rows = []
    for r in results("memory_formula")["memory_formula"]:
        p = r["profile"]
        kept = "every element" if p["stride"] == 1 else f"1 element in {p['stride']}"
        rows.append((f"{r['name']}, N = {r['N']}", f"{num(r['apply_cache_bytes'] / GIB, '.3f')} GiB",
                     f"{num((p['history'] + p['prev_h']) / GIB, '.3f')} GiB", f"{num(p['total'] / GIB, '.3f')} GiB",
                     kept, f"{num(r['profile_unsampled']['total'] / GIB, '.2f')} GiB"))
    return table(["model, run", "Apply cache", "Profile: held (history + previous h)", "Profile: upper bound",
                  "residual kept", "upper bound if every element were kept"], rows)


# ------------------------------------------------------------------------------------------------ quality
def at(results, run: str = "quality_quick") -> dict:
    """(K, method) → row of bench/quality.py's summary."""
    return {(r["K"], r["method"]): r for r in results(run)["rows"]}


def ks(results, run: str = "quality_quick") -> list:
    return sorted({r["K"] for r in results(run)["rows"]})


SEARCHED = ("gcache_forecast", "gcache_forecast_nopolish")  # their forecaster is the forecaster check's pick


def cell(rows: dict, k: int, method: str, own: str = "") -> str:
    """A PSNR cell; a search whose forecaster check moved it to another forecaster than `own` names it."""
    r = rows.get((k, method))
    if r is None:
        return "—"
    text = num(r["psnr"], ".2f")
    fc = r.get("forecaster")
    return text + (f" ({fc})" if method in SEARCHED and own and fc and fc != own else "")


def bold_best(cells: list, values: list) -> list:
    top = max(v for v in values if v is not None)
    return [f"**{c}**" if v == top else c for c, v in zip(cells, values)]


def quality_row(rows: dict, k: int, methods: list, own: str) -> list:
    cells = [cell(rows, k, m, own) for m in methods]
    values = [rows[(k, m)]["psnr"] if (k, m) in rows else None for m in methods]
    return [k] + bold_best(cells, [None if v is None else round(v, 2) for v in values])


@block("quality_quick.objective")
def quality_objective(results) -> str:
    names = {"ssim": "1 − SSIM", "lpips_ssim": "LPIPS + 1 − SSIM", "psnr": "−PSNR"}
    return names.get(results("quality_quick")["objective"], results("quality_quick")["objective"])


@block("quality_quick.table")
def quality_table(results) -> str:
    rows, res = at(results), results("quality_quick")
    methods = ["uniform", "teacache", "theory_dp", "instant_fitted", "instant_auto", "gcache", "gcache_forecast",
               "l2p_gcache_mask"]
    out = [quality_row(rows, k, methods, res["auto_forecaster"][str(k)]) for k in ks(results)]
    return table(["K", "uniform", "TeaCache-like", "theory DP (reuse)", "fitted, own DP mask",
                  "auto (its forecaster, reuse DP mask)", "search (reuse)", "search (auto's forecaster, its check)",
                  "l2p on the searched mask"], out)


def per_k(d: dict, spec: str = "+.2f") -> str:
    return joined(d.values(), spec)


def k_list(results) -> str:
    return " / ".join(str(k) for k in ks(results))


@block("quality_quick.bullets")
def quality_bullets(results) -> str:
    rows, res = at(results), results("quality_quick")
    kk = ks(results)
    over_own = [rows[(k, "instant_auto")]["psnr"] - rows[(k, "instant_fitted")]["psnr"] for k in kk
                if res["auto_forecaster"][str(k)] == "fitted"]
    lines = [f"Auto applies its forecaster on the reuse DP's mask: {span(over_own, '+.2f')} dB over fitted on its own "
             f"DP mask here, and across N = 20, 30, 50 ([forecasting](forecasting.md#how-auto-chooses)) "
             f"{auto_error_models_prose(results)}."]
    polish = f"The search's polish stage (JSON `polish_gain_db`, median over 3 GP seeds): " \
             f"{per_k(res['polish_gain_db'])} " \
             f"dB at K = {k_list(results)}"
    if "polish_runs" in res:
        worst = min(r["polish"]["psnr"] - r["nopolish"]["psnr"] for runs in res["polish_runs"].values()
                    for r in runs.values())
        polish += f"; the lowest single search's gain was {num(worst, '+.2f')} dB"
    g64 = results("polish_guard_64")["median_gain_db"]["z"]
    lines.append(polish + f". At the default budget 64 (`bench/polish_guard.py --budget 64`): {per_k(g64)} dB.")
    switched = [k for k in kk
                if rows[(k, "gcache_forecast")].get("forecaster") not in (None, res["auto_forecaster"][str(k)])]
    if switched:
        lines.append(f"The forecaster check or the final choice on fresh seeds moved the searched policy to another "
                     f"forecaster at K = "
                     f"{', '.join(map(str, switched))} (in brackets in the table; [search](search.md#what-it-does)).")
    fvs = res["forecast_search_minus_best_other_psnr"]
    lines.append("Forecast search − the best row that is no search (every forecaster's instant policy on its own DP "
                 "mask and on auto's, the baselines, the rivals on the searched mask; JSON "
                 "`forecast_search_minus_best_other_psnr`): " + " / ".join(
                     f"{num(v['margin_db'], '+.2f')}" for v in fvs.values()) + f" dB at K = {k_list(results)} (best "
                 "other row: " + ", ".join(f"{v['best_other']} at K = {k}" for k, v in fvs.items()) + ").")
    fvs64 = results("quality_64")["forecast_search_minus_best_other_psnr"]
    lines.append("At the default budget 64 (`bench/quality.py --quick --budget 64 --gp-seeds 0`): " + " / ".join(
        f"{num(v['margin_db'], '+.2f')}" for v in fvs64.values()) + " dB (best other row: " + ", ".join(
        f"{v['best_other']} at K = {k}" for k, v in fvs64.items()) + ").")
    cost, floor = res["forecast_search_cost"], res["budget_floor"]
    lines.append("What it cost (JSON `forecast_search_cost`): " + " / ".join(
        str(c["other_forecaster_starts"]) for c in cost.values()) + " of its " + " / ".join(
        str(c["start_masks"]) for c in cost.values()) + " start masks under another forecaster, and " + " / ".join(
        str(c["check_evaluations"]) for c in cost.values()) + " forecaster-check evaluations and " + " / ".join(
        str(c.get("fresh_evaluations", 0)) for c in cost.values()) + " evaluations on the fresh seeds (beside their "
        "full-compute runs) after the budget, at K = " + k_list(results) + "; the least budget at degree 3 is "
        + ", ".join(
            f"{v['with_other_forecasters']} for {fc} ({v['own_start_masks_only']} with its own start masks only)"
            for fc, v in floor.items()) + ".")
    lines.append(f"Reuse search − best other reusing method: {per_k(res['search_minus_best_other_psnr'])} dB (JSON "
                 "`search_minus_best_other_psnr`). The search returns the lowest loss it measured, never worse than "
                 "its best start mask on its own seeds and never a polish move its guard rejected "
                 "([search](search.md#what-it-does), `bench/choice_regret.py`).")
    riv = res.get("rival_minus_fitted_db", {})
    if riv:
        spec = [v for where in riv.get("spectrum", {}).values() for v in where.values()]
        l2p_all = [v for where in riv.get("l2p_all", {}).values() for v in where.values()]
        lines.append(f"Today's rivals as rows (`bench/rivals.py`), minus fitted on the same mask (JSON "
                     f"`rival_minus_fitted_db`): a Spectrum-like Chebyshev forecaster {span(spec, '+.2f')} dB, "
                     f"L2P-like least squares over every computed residual {span(l2p_all, '+.2f')} dB (GCache's `l2p` "
                     "is its variant over the last four).")
    dp = results("dp_speed")
    lines.append("GCache Policy's DP is instant (`bench/dp_speed.py`, "
                 f"{str(results.record('dp_speed')['date'])[:10]}): a median {dp_reuse(results)} ms at N = "
                 f"{' / '.join(dp['reuse'])} (reuse, K = N/3).")
    return "\n" + "\n".join(wrap_bullet(t) for t in lines) + "\n"


def wrap_bullet(text: str, width: int = 116) -> str:
    """A markdown bullet wrapped at width (continuation lines indented by two)."""
    words, lines, cur = text.split(" "), [], "-"
    for w in words:
        if len(cur) + 1 + len(w) > width and cur not in ("-", "  "):
            lines.append(cur)
            cur = "  " + w
        else:
            cur = f"{cur} {w}" if cur not in ("  ",) else cur + w
    lines.append(cur)
    return "\n".join(lines)


@block("quality_64.fresh")
def fresh_prose(results) -> str:
    """The final choice on fresh seeds at budget 64: where it replaced the check's pick, and the issue's margin."""
    res = results("quality_64")
    cost, fvs = res["forecast_search_cost"], res["forecast_search_minus_best_other_psnr"]
    replaced = [k for k, c in cost.items() if c.get("fresh_replaced")]
    return (f"at budget 64 ({str(results.record('quality_64')['date'])[:10]}, `bench/quality.py --quick --budget 64 "
            f"--gp-seeds 0`) it sampled " + " / ".join(str(c.get("fresh_evaluations", 0)) for c in cost.values())
            + f" finalists on the fresh seeds at K = {' / '.join(cost)} of 30 and replaced the pick at "
            + (f"K = {', '.join(replaced)}" if replaced else "no K") + "; the forecast search minus the best row "
            "that is no search (every forecaster's instant policy on its own DP mask and on auto's, the baselines, the "
            "rivals on the searched mask) was then "
            + " / ".join(f"{num(v['margin_db'], '+.2f')}" for v in fvs.values()) + " dB held-out")


@block("quality_quick.forecast_table")
def forecast_table(results) -> str:
    rows, res = at(results), results("quality_quick")
    methods = ["instant_1batch", "instant_linear", "instant_fitted", "instant_l2p", "instant_auto", "l2p_auto_mask",
               "gcache", "gcache_forecast"]
    out = [quality_row(rows, k, methods, res["auto_forecaster"][str(k)]) for k in ks(results)]
    return table(["K", "instant reuse", "instant linear", "instant fitted (own DP mask)", "instant l2p (own DP mask)",
                  "auto (its forecaster, reuse DP mask)", "l2p on auto's mask", "reuse search",
                  "search with auto's forecaster"], out)


@block("quality_quick.forecast_bullets")
def forecast_bullets(results) -> str:
    rows, res = at(results), results("quality_quick")
    kk = ks(results)
    picks = sorted(set(res["auto_forecaster"].values()))
    over_own = [rows[(k, "instant_auto")]["psnr"] - rows[(k, "instant_fitted")]["psnr"] for k in kk
                if res["auto_forecaster"][str(k)] == "fitted"]
    lines = [f"Auto picked {' and '.join(picks)} here; its instant policy is "
             f"{per_k(res['instant_forecast_minus_reuse_db'])} dB over the instant reuse policy at K = "
             f"{k_list(results)}"
             + (f", and {span(over_own, '+.2f')} dB over fitted on its own DP's mask." if over_own else "."),
             f"Fitted is {per_k(res['fitted_minus_linear_db'])} dB over linear on their own DP masks.",
             f"A search with forecasting on is {per_k(res['forecast_gain_db'], '+.1f')} dB over the reuse search."]
    n = max(kk) + (max(kk) // 2)  # N from the Ks of --quick: 2N/3 is the largest
    third, half = n // 3, n // 2
    if (third, "instant_auto") in rows and (half, "gcache") in rows:
        a, r = rows[(third, "instant_auto")]["psnr"], max(rows[(half, m)]["psnr"] for m in ("instant_1batch", "gcache"))
        lines.append(f"Forecasting at K = {third} of {n} (auto, no search: {num(a, '.2f')} dB) "
                     f"{'beats' if a > r else 'does not beat'} reuse at K = {half} (best instant or searched: "
                     f"{num(r, '.2f')} dB), which runs the block stack on {half - third} more steps.")
    return "\n" + "\n".join(wrap_bullet(t) for t in lines) + "\n"


@block("quality_quick.search_gains")
def search_gains(results) -> str:
    rows, res = at(results), results("quality_quick")
    kk = ks(results)
    gain = {k: rows[(k, "gcache_forecast")]["psnr"] - rows[(k, "instant_auto")]["psnr"] for k in kk}
    k0 = kk[0]
    return (f"with auto's forecaster (and its forecaster check's pick) the search's policy was "
            f"{joined(gain.values(), '+.2f')} dB over auto's instant policy at K = {k_list(results)} of 30 "
            f"({num(rows[(k0, 'gcache_forecast')]['psnr'], '.2f')} against "
            f"{num(rows[(k0, 'instant_auto')]['psnr'], '.2f')} dB at K = {k0}), its polish stage "
            f"{per_k(res['polish_gain_db'])} dB of that (median over 3 GP seeds); with reuse the search was "
            f"{per_k(res['search_minus_best_other_psnr'])} dB over the best other reusing method.")


# ------------------------------------------------------------------------------------------------ search's choices
@block("polish_guard.table")
def polish_guard_table(results) -> str:
    r48, r64 = results("polish_guard_48"), results("polish_guard_64")
    rows = []
    for guard in r48["median_gain_db"]:
        rows.append((guard, per_k(r48["median_gain_db"][guard]), per_k(r64["median_gain_db"][guard])))
    kk = " / ".join(r48["median_gain_db"][next(iter(r48["median_gain_db"]))])
    return table(["guard", f"budget 48: K = {kk}", "budget 64"], rows) + (
        "\nMedian over GP seeds of polish − no polish, held-out dB "
        f"({str(results.record('polish_guard_48')['date'])[:10]}). z − halves, search by search: budget 48 better in "
        f"{r48['z_vs_halves']['better']}, worse in {r48['z_vs_halves']['worse']}, same in "
        f"{r48['z_vs_halves']['same']}; budget 64 better in {r64['z_vs_halves']['better']}, worse in "
        f"{r64['z_vs_halves']['worse']}, same in {r64['z_vs_halves']['same']}.\n")


@block("polish_guard.prose")
def polish_guard_prose(results) -> str:
    r48, r64 = results("polish_guard_48"), results("polish_guard_64")
    better = r48["z_vs_halves"]["better"] + r64["z_vs_halves"]["better"]
    worse = r48["z_vs_halves"]["worse"] + r64["z_vs_halves"]["worse"]
    same = r48["z_vs_halves"]["same"] + r64["z_vs_halves"]["same"]
    worst = min(r48["z_vs_halves"]["worst_db"], r64["z_vs_halves"]["worst_db"])
    z, h = r48["median_gain_db"]["z"], r48["median_gain_db"]["halves"]
    k = max(z, key=lambda kk: (abs(z[kk] - h[kk]), -int(kk)))  # the K where the two guards differ most
    return (f"the z guard was better in {better}, worse in {worse} and tied in {same} of {better + worse + same} "
            f"searches at budgets 48 and 64 (at worst {db(worst, '+.2f')} dB against the halves guard), and at "
            f"K = {k} of 30 (budget 48) its median gain over no polish was {db(z[k], '+.2f')} dB where the halves "
            f"guard's was {db(h[k], '+.2f')} dB")


@block("forecaster_check.prose")
def forecaster_check_prose(results) -> str:
    res = results("forecaster_check")
    rule = res["rules"]["halves"]
    base = lambda r: r.get("searched_with", "fitted")  # noqa: E731  (results before 2026-11-28: fitted's masks only)
    switched_k = sorted({r["K"] for r in res["runs"] if r["picks"]["halves"]["forecaster"] != base(r)})
    gains = ", ".join(f"{num(rule['median_gain_db_per_k'][str(k)], '+.2f')} dB at K = {k}" for k in switched_k)
    won = sorted({base(r) for r in res["runs"]})
    kept = len(res["runs"]) - rule["switched"]  # a tie with never switching: the same policy
    others = [f"{words} switched in {res['rules'][name]['switched']} (worst gain "
              f"{num(res['rules'][name]['worst_gain_db'], '+.2f')} dB)"
              for name, words in (("mean", "a lower mean loss"), ("noise", "a gain beyond 2 standard errors"))
              if name in res["rules"]]
    return (f"the searches returned a candidate of {' or '.join(won)}; the check switched its forecaster in "
            f"{rule['switched']} of {len(res['runs'])} searches"
            + (f" (at K = {', '.join(map(str, switched_k))}; median held-out gain {gains})" if switched_k else "")
            + f" and kept it in {kept} (tied with never switching), and its worst held-out gain over keeping the "
              f"candidate's forecaster was {num(rule['worst_gain_db'], '+.2f')} dB"
            + (f"; of the rules compared, {' and '.join(others)}" if others else ""))


# ------------------------------------------------------------------------------------------------ forecasting.md
def auto_error_models_prose(results) -> str:
    res = results("auto_error_models")
    s = res["auto_minus_own_dp"]
    rows = res["rows"]
    top = max(rows, key=lambda r: r["auto_minus_own_dp_db"])
    low = min(rows, key=lambda r: r["auto_minus_own_dp_db"])
    text = (f"the forecaster on the reuse DP's mask (what auto applies) beat it on its own DP's mask at {s['better']} "
            f"of {s['of']} (N, K), median {num(s['median'], '+.2f')} dB ({num(top['auto_minus_own_dp_db'], '+.2f')} dB "
            f"at N = {top['N']}, K = {top['K']})")
    if s["worse"]:
        text += (f", and lost at {s['worse']} ({num(low['auto_minus_own_dp_db'], '+.2f')} dB at N = {low['N']}, "
                 f"K = {low['K']})")
    return text


BLOCKS["auto_error_models.prose"] = auto_error_models_prose


@block("auto_error_models.own_masks")
def auto_error_models_own_masks(results) -> str:
    res = results("auto_error_models")
    s = res["own_masks_by_bound_minus_auto"]
    verdict = ("so auto now lets the bound choose" if res["own_masks_by_bound_keep"] else
               "so auto does not (the rule for changing it: a median win and no loss beyond 1 dB)")
    return (f"letting the held-out bound choose between auto's policy and each candidate's own instant policy gave "
            f"a median {num(s['median'], '+.2f')} dB against auto (better at {s['better']}, worse at {s['worse']} of "
            f"{s['of']} (N, K), {num(s['min'], '+.2f')} to {num(s['max'], '+.2f')} dB), {verdict}")


@block("l2p_keeps.l2p")
def l2p_keeps_l2p(results) -> str:
    d = results("l2p_keeps")["minus_fitted_db"]["l2p"]
    return f"median {num(d['median'], '+.2f')} dB, from {num(d['min'], '+.2f')} to {num(d['max'], '+.2f')} dB"


def dp_reuse(results) -> str:
    return joined((r["median_ms"] for r in results("dp_speed")["reuse"].values()), ".2f")


@block("dp_speed.linear")
def dp_speed_linear(results) -> str:
    return span([r["median_ms"] for r in results("dp_speed")["linear"].values()], ".1f")


# ------------------------------------------------------------------------------------------------ works-with.md
def few_rows(results, speedup=None) -> list:
    return [r for r in results("few_steps")["rows"] if speedup is None or r["speedup"] == speedup]


@block("few_steps.table_2x")
def few_steps_table(results) -> str:
    out = []
    for r in few_rows(results, 2.0):
        cols = ["fewer steps", "reuse", "linear", "fitted", "auto", "bound_pick"]
        cells = [db(r[c]) for c in cols]
        cells[4] += f" ({r['auto_forecaster']})"
        cells[5] += f" ({r['bound_forecaster']})"
        out.append([r["N"], r["K"]] + bold_best(cells, [r[c] for c in cols]))
    return table(["N", "K", "fewer steps", "reuse", "linear", "fitted", "auto", "bound's pick"], out)


@block("few_steps.table_pays")
def few_steps_pays(results) -> str:
    res = results("few_steps")
    top = max(r["N"] for r in res["rows"])
    out = []
    for s, start in res["pays_from"].items():
        r = next(r for r in res["rows"] if r["N"] == top and f"{r['speedup']:g}" == s)
        out.append((f"{s}×", "never" if start is None else f"N = {start}",
                    f"K = {r['K']}: {db(r['best_cache_minus_fewer_steps'], '+.2f')} dB"))
    return table(["target", "caching beats fewer steps from", f"at N = {top} (K; best cache − fewer steps)"], out)


@block("few_steps.below")
def few_steps_below(results) -> str:
    lost = [r for r in few_rows(results) if r["best_cache_minus_fewer_steps"] is not None
            and r["best_cache_minus_fewer_steps"] <= 0]
    r = max(lost, key=lambda r: (r["N"], r["speedup"]))
    return f"e.g. N = {r['N']} at {r['speedup']:g}×, K = {r['K']}: {db(r['best_cache_minus_fewer_steps'], '+.2f')} dB"


@block("few_steps.rule")
def few_steps_rule(results) -> str:
    res = results("few_steps")
    cases: dict = {}  # (N, K) -> its speed-ups and the row (targets that give the same K sample the same policies)
    for r in res["rows"]:
        if r["N"] <= res["few_steps_rule"] and 1 < r["K"] < r["N"] and r["bound_forecaster"] != "reuse":
            cases.setdefault((r["N"], r["K"]), ([], r))[0].append(f"{r['speedup']:g}×")
    parts = [f"N = {n}, K = {k} ({'/'.join(s)}, {r['bound_forecaster']}): {db(r['bound_pick'] - r['reuse'], '+.2f')}"
             for (n, k), (s, r) in cases.items()]
    return "; ".join(parts) if parts else "none (the bound picked reuse everywhere)"


# ------------------------------------------------------------------------------------------------ cluster, routes
def cluster_row(results, run: str) -> tuple:
    r = results(run)
    se = r.get("quality_diff_se_db")
    return (f"{r['budget']}", f"{num(r['speedup_2_workers'], '.2f')}× ({span(r['speedup_per_gp_seed'], '.2f')}×)",
            f"{num(r['held_out_psnr_mean']['sequential'], '.2f')} dB",
            f"{num(r['held_out_psnr_mean']['2_workers'], '.2f')} dB",
            f"{num(r['quality_diff_db'], '+.3f')} ± {num(se, '.3f')} dB", str(results.record(run)["date"])[:10])


@block("cluster.table")
def cluster_table(results) -> str:
    return table(["budget", "2 workers vs 1 (median of 16 GP seeds, range)", "held-out PSNR: sequential", "2 workers",
                  "difference (paired s.e.)", "date"], [cluster_row(results, "cluster_64"),
                                                        cluster_row(results, "cluster_48")])


@block("cluster.search_md")
def cluster_search_md(results) -> str:
    r = results("cluster_64")
    return (f"2 workers were {num(r['speedup_2_workers'], '.2f')}× faster than the sequential search at budget "
            f"{r['budget']} (median over {len(r['speedup_per_gp_seed']) if len(r['speedup_per_gp_seed']) > 2 else 16} "
            f"GP seeds), with a held-out PSNR difference of {num(r['quality_diff_db'], '+.3f')} ± "
            f"{num(r['quality_diff_se_db'], '.3f')} dB (paired s.e.)")


@block("route_quality.table")
def route_quality_table(results) -> str:
    names = {"flux2": "Flux 2", "z_image": "Z-Image"}
    rows = []
    for fam, r in results("route_quality").items():
        if not isinstance(r, dict):
            continue
        rows.append((names.get(fam, fam), f"{num(r['block stack'], '.2f')} dB", f"{num(r['whole model'], '.2f')} dB",
                     f"{num(r['block_minus_whole_db'], '+.2f')} ± {num(r['paired_se_db'], '.2f')} dB",
                     f"{num(r['whole model on the block mask'], '.2f')} dB"))
    return table(["family", "block stack", "whole model", "difference (paired s.e.)",
                  "whole model on the block stack's mask"], rows)


# ------------------------------------------------------------------------------------------------ peers
PEER_FAMILIES = {"flux": "Flux-class", "wan": "Wan 2.1-class"}


PEER_RUNS = ("peers", "peers_0.3.64")  # one result per ComfyUI tree (bench/runs.py)
ALT_NAMES = {"EasyCache": "EasyCache", "EasyCache wide": "EasyCache (start 0, end 1)", "LazyCache": "LazyCache",
             "LazyCache wide": "LazyCache (start 0, end 1)", "fewer steps": "fewer steps"}


def _versus(h) -> str:
    """'+1.23 dB (+0.50 to +2.01) vs EasyCache (start 0, end 1)', or why there is none."""
    if h["psnr_diff"] is None:
        return "none reaches it"
    lo, hi = h["interval"]
    return (f"{num(h['psnr_diff'], '+.2f')} dB ({num(lo, '+.2f')} to {num(hi, '+.2f')}) vs "
            f"{ALT_NAMES.get(h['best'], h['best'])}")


def _peer_blocks(run: str) -> None:
    """The blocks of one tree's peers result, named <run>.<block>."""

    @block(f"{run}.table")
    def peers_table(results) -> str:
        rows = []
        for fam, r in results(run)["families"].items():
            for row in r["rows"]:
                rows.append((PEER_FAMILIES.get(fam, fam), row["row"], f"{num(row['speedup_passes'], '.2f')}×",
                             f"{num(row['speedup_io'], '.2f')}×", f"{num(row['speedup_wall'], '.2f')}×",
                             f"{num(row['psnr_mean'], '.2f')} dB", num(row["ssim_mean"], ".3f")))
        return table(["model", "row", "speed-up (block-stack passes)", "speed-up (io-inclusive cost)",
                      "speed-up (wall clock)", "PSNR vs plain", "SSIM vs plain"], rows)

    @block(f"{run}.curve")
    def peers_curve(results) -> str:
        """Auto at each K beside plain sampling with K steps, and the best alternative at auto's speed-up on both
        axes."""
        rows = []
        for fam, r in results(run)["families"].items():
            fewer = {x["k"]: x for x in r["rows"] if x["kind"] == "fewer steps"}
            heads = {axis: {h["gcache"]: h for h in r["headline"][axis]} for axis in ("passes", "io")}
            for g in (x for x in r["rows"] if x["kind"] == "gcache k"):
                f = fewer.get(g["k"])
                rows.append((PEER_FAMILIES.get(fam, fam), g["k"], f"{num(g['psnr_mean'], '.2f')} dB",
                             "–" if f is None else f"{num(f['psnr_mean'], '.2f')} dB",
                             f"{num(g['speedup_passes'], '.2f')}×", _versus(heads["passes"][g["row"]]),
                             f"{num(g['speedup_io'], '.2f')}×", _versus(heads["io"][g["row"]])))
        return table(["model", f"K of {results(run)['steps']}", "auto", "plain, K steps", "speed-up (passes)",
                      "auto − the best alternative there (95 % bootstrap)", "speed-up (io-inclusive)",
                      "auto − the best alternative there (95 % bootstrap)"], rows)

    @block(f"{run}.headline")
    def peers_headline(results) -> str:
        """The target rows and the search's rows against the best alternative, on both axes."""
        rows = []
        for fam, r in results(run)["families"].items():
            io = {h["gcache"]: h for h in r["headline"]["io"]}
            for h in r["headline"]["passes"]:
                if h["kind"] == "gcache k":
                    continue
                hio = io[h["gcache"]]
                rows.append((PEER_FAMILIES.get(fam, fam), h["gcache"], h["k"], f"{num(h['psnr'], '.2f')} dB",
                             f"{num(h['speedup_passes'], '.2f')}×", _versus(h), f"{num(hio['speedup_io'], '.2f')}×",
                             _versus(hio)))
        return table(["model", "GCache row", "K", "PSNR", "speed-up (passes)", "GCache − the best alternative there",
                      "speed-up (io-inclusive)", "GCache − the best alternative there"], rows)

    @block(f"{run}.verdict")
    def peers_verdict(results) -> str:
        """How many of auto's fixed-K rows are ahead of, level with or behind the best alternative (by the bootstrap
        interval), on each axis."""
        res = results(run)
        parts = []
        for fam, r in res["families"].items():
            axes = []
            for axis, name in (("passes", "in passes"), ("io", "io-inclusive")):
                hs = [h for h in r["headline"][axis] if h["kind"] == "gcache k"]
                diffs = [h for h in hs if h["psnr_diff"] is not None]
                ahead = sum(h["interval"][0] > 0 for h in diffs)
                behind = sum(h["interval"][1] < 0 for h in diffs)
                worst = min(diffs, key=lambda h: h["psnr_diff"]) if diffs else None
                beyond = f", beyond every alternative at {len(hs) - len(diffs)}" if len(diffs) < len(hs) else ""
                axes.append(f"{name}, ahead at {ahead}, level at {len(diffs) - ahead - behind}, behind at {behind}"
                            + beyond
                            + (f" (worst: K = {worst['k']}, {num(worst['psnr_diff'], '+.1f')} dB)"
                               if worst is not None and worst["psnr_diff"] < 0 else ""))
            ks = [h["k"] for h in r["headline"]["passes"] if h["kind"] == "gcache k"]
            parts.append(f"{PEER_FAMILIES.get(fam, fam)} (K = {min(ks)}–{max(ks)}, io share r = "
                         f"{num(r['io_share'], '.3f')}): " + "; ".join(axes))
        return "; ".join(parts) + "."


    @block(f"{run}.minutes")
    def peers_minutes(results) -> str:
        rec = results.record(run)
        return f"{num(rec['wall_s'] / 60, '.0f')} min on {machine(rec)}, beside other work"


for _run in PEER_RUNS:
    _peer_blocks(_run)


@block("peers.search")
def peers_search(results) -> str:
    rows = []
    for fam, r in results("peers")["families"].items():
        for x in r.get("search_vs_auto", []):
            lo, hi = x["interval"]
            rows.append((PEER_FAMILIES.get(fam, fam), x["k"], x["auto"],
                         f"{num(x['psnr_diff'], '+.2f')} dB ({num(lo, '+.2f')} to {num(hi, '+.2f')})"))
    if not rows:
        return "the stored run has no search rows (its command has no `--search-budget`)"
    return table(["model", "K (of 20)", "auto row", "Search − auto PSNR (95 % bootstrap)"], rows)


# ------------------------------------------------------------------------------------------------ trained figures
def mean(values) -> float:
    return sum(values) / len(values)


@block("trained_figures.table")
def trained_figures_table(results) -> str:
    """Issue 42 item 3 on the trained models: one row per figure and model (figures from the stored result; means
    over its pairs computed here)."""
    res = results("trained_figures")
    rows = []
    for fam, r in res["families"].items():
        name = PEER_FAMILIES.get(fam, fam)
        sc, sp, comp = r["selfcheck"], r["speedup"], r["composition"]
        rows.append((name, "self-check at run 1: replay error / tolerance",
                     f"{num(sc['error'], '.3g')} / {num(sc['tolerance'], '.3g')} ({sc['dtype']}): {sc['result']}, "
                     f"the error {num(sc['margin'], '.1f')} × under the tolerance"))
        rows.append((name, f"auto {num(res['target'], 'g')}×: predicted against measured speed-up",
                     f"K = {sp['k']} of {sp['n']}: predicted {num(sp['predicted'], '.2f')}×, measured "
                     f"{num(sp['measured_wall'], '.2f')}× (whole runs' wall clock, median) and "
                     f"{num(sp['measured_logged'], '.2f')}× (GCache's log line, median)"))
        for x in comp["rows"]:
            rows.append((name, f"GCache + {x['x']} against plain + {x['x']}",
                         f"{num(x['ratio'], '.2f')} × GCache's own distance "
                         f"({num(mean(x['gcache_x_vs_plain_x']), '.4f')} against "
                         f"{num(mean(comp['gcache_vs_plain']), '.4f')}, relative L2 of the latents); PSNR "
                         f"{num(mean(x['psnr']), '.2f')} dB"))
        for f in r["few_steps"]:
            ks = sorted(set(f["k"]))
            rows.append((name, f"{f['n']} steps: auto {num(res['target'], 'g')}× against {joined(ks)} plain steps",
                         f"{num(mean(f['auto_psnr']), '.2f')} against {num(mean(f['fewer_steps_psnr']), '.2f')} dB "
                         f"vs plain {f['n']} steps ({num(f['auto_minus_fewer'], '+.2f')} dB)"))
    return table(["model", "figure", f"measured ({res['held_out_pairs']} held-out pairs, {res['steps']} steps)"], rows)


# ------------------------------------------------------------------------------------------------ speed-up prediction
def prediction_parts(results) -> list:
    res = results("speedup_prediction")
    out = []
    for key, part in res.items():
        if not isinstance(part, dict) or "by_k" not in part:
            continue
        name = part["model"]
        short = ("reference DiT" if key == "reference" else "tiny Wan 2.1" if "Wan" in name else
                 "tiny Flux" if "Flux" in name else name)
        out.append((f"{short}, N = {part['N']}", part))
    return out


@block("speedup_prediction.table")
def speedup_prediction_table(results) -> str:
    rows = []
    for name, part in prediction_parts(results):
        pred = [f["predicted"] for f in part["by_k"].values()]
        meas = [f["measured"] for f in part["by_k"].values()]
        rows.append((name, " / ".join(part["by_k"]), joined((p["median"] for p in pred), ".3f"),
                     " / ".join(f"{num(m['median'], '.3f')} ({num(m['min'], '.3f')}–{num(m['max'], '.3f')})"
                                for m in meas)))
    return table(["model", "K", "predicted (median of the reruns)", "measured, whole runs: median (min–max)"], rows)


@block("speedup_prediction.prose")
def speedup_prediction_prose(results) -> str:
    rec, res = results.record("speedup_prediction"), results("speedup_prediction")
    parts = prediction_parts(results)
    spreads = "; ".join(f"{span([100 * f['predicted']['spread'] for f in p['by_k'].values()], '.1f')} % on the {n}"
                        for n, p in parts)
    inside = [f["predicted_within_measured"] for _, p in parts for f in p["by_k"].values()]
    where = f" ({os.path.basename(str(res.get('comfyui_path', '')).rstrip('/'))})" if res.get("comfyui_path") else ""
    return (f"{str(rec['date'])[:10]}, {machine(rec)}{where}, {res['reruns']} reruns of {res['repeats']} pairs: the "
            f"prediction's spread over the reruns, (max − min) / median, was {spreads} (goal ≤ 5 %); the predicted "
            f"median lay within the measured min–max of whole runs for {sum(inside)} of {len(inside)} (model, K). "
            "Excerpt:")


# ------------------------------------------------------------------------------------------------ works-with.md
COMPOSITION_RUNS = {"composition": "0.33.0", "composition_0.3.64": "0.3.64"}  # run → the ComfyUI it measures
COMPOSITION_FAMILIES = {"flux": "Flux", "wan": "Wan", "lumina2": "Lumina2"}


def composition(results, run: str = "composition") -> dict:
    """A composition result, checked to be of the ComfyUI version its run names."""
    res = results(run)
    if res["comfyui"] != COMPOSITION_RUNS[run]:
        raise RenderError(f"{run} was measured on ComfyUI {res['comfyui']}, not {COMPOSITION_RUNS[run]}: rerun "
                          f"`{results.record(run)['command']}`")
    return res


def composition_rows(res: dict, x: str, family: str) -> list:
    rows = [r for r in res["rows"] if r["x"] == x and r["family"] == family]
    if not rows:
        raise RenderError(f"the composition result has no row for {family} {x}")
    return rows


def composition_figures(res: dict, xs: tuple) -> str:
    """GCache + X against plain + X on Flux, then Wan: a range over the blocks of one X, or 'a and b' of two Xs."""
    per_family = []
    for fam in ("flux", "wan"):
        values = [[r["gcache_x_vs_plain_x"] for r in composition_rows(res, x, fam)] for x in xs]
        per_family.append(" and ".join(span(v, ".4f") for v in values))
    return ", ".join(per_family)


def composition_orders(res: dict, xs: tuple, say_identical: str = "") -> str:
    """What the node orders gave: `say_identical` when every row of xs was bit-identical, else where they differ."""
    rows = [r for x in xs for fam in ("flux", "wan") for r in composition_rows(res, x, fam)]
    differ = [f"{COMPOSITION_FAMILIES[r['family']]}, {r['where'] or r['x']}" for r in rows if r["orders"] == "differ"]
    if differ:
        return f"; the node orders differ ({'; '.join(differ)})"
    return say_identical


@block("composition.base")
def composition_base(results) -> str:
    res = composition(results)
    return ", ".join(f"{num(res['gcache_vs_plain'][f], '.4f')} on {COMPOSITION_FAMILIES[f]}" for f in ("flux", "wan"))


@block("composition.largest")
def composition_largest(results) -> str:
    res = composition(results)
    worst = max((r for r in res["rows"] if r["ratio"] is not None), key=lambda r: r["ratio"])
    what = worst["x"].replace("30-80 %", "on 30–80 % of the steps")
    where = f" on the {worst['where']} block" if worst["where"] and "steps" not in what else ""
    return f"{num(worst['ratio'], '.2f')}, {COMPOSITION_FAMILIES[worst['family']]} with {what}{where}"


@block("composition.table")
def composition_table(results) -> str:
    res = composition(results)
    slg, simple, part = "SkipLayerGuidanceDiT", "SkipLayerGuidanceDiTSimple", "SkipLayerGuidanceDiT 30-80 %"
    patch, guiders, cfgs = "another node's block patch", ("PerpNegGuider", "DualCFGGuider"), ("CFGZeroStar", "APG")
    lumina = composition_rows(res, "another node's object patch after GCache", "lumina2")
    object_patch = ("equal to plain + X" if all(r["gcache_x_vs_plain_x"] == 0 for r in lumina) else
                    span([r["gcache_x_vs_plain_x"] for r in lumina], ".4f")) + " (tiny Lumina2)"
    rows = [
        (f"**{slg}**, first, a middle or the last block, either order",
         "the guidance's extra cond call is a branch of its own"
         + composition_orders(res, (slg,), "; both orders bit-identical"), composition_figures(res, (slg,))),
        (f"**{simple}**, the same blocks and orders", "the uncond call with the skip is a branch of its own"
         + composition_orders(res, (simple,)), composition_figures(res, (simple,))),
        (f"{slg} on 30–80 % of the steps", "the guidance's branch computes on its first step"
         + composition_orders(res, (part,)), composition_figures(res, (part,))),
        ("**PerpNegGuider**, **DualCFGGuider** (three conds per call)", "a residual per cond",
         composition_figures(res, guiders)),
        ("**CFGZeroStar**, **APG** (post- and pre-CFG functions)", "nothing to do: they only combine the conds' outputs"
         + composition_orders(res, cfgs), composition_figures(res, cfgs)),
        ("another node's block patch, before GCache, after it, or after it calling through GCache's own patch",
         "called on every computed step, exactly as without GCache (once per call, never twice)"
         + composition_orders(res, (patch,), "; all orders bit-identical"), composition_figures(res, (patch,))),
        ("another node's object patch of a block after GCache (Lumina2, Z-Image, HiDream, … whose blocks GCache "
         "patches as objects)", "can't be wrapped per call: said in the log (\"put that node before GCache\"); the "
         "calls that miss GCache's first or last block compute", object_patch),
    ]
    return table(["X beside GCache", "what GCache does", "GCache + X vs plain + X (Flux, Wan)"], rows)


@block("composition.versions")
def composition_versions(results) -> str:
    """Whether ComfyUI 0.3.64 gave the figures the table shows for 0.33.0 (GCache vs plain, GCache + X vs plain + X
    and the orders; X vs plain, which the table does not show, may differ where a model's code changed)."""
    new, old = composition(results), composition(results, "composition_0.3.64")

    def shown(res):
        return ([res["gcache_vs_plain"][f] for f in ("flux", "wan")],
                [(r["family"], r["x"], r["where"], r["gcache_x_vs_plain_x"], r["orders"]) for r in res["rows"]])
    if shown(new) == shown(old):
        return "ComfyUI 0.3.64 gave the same figures"
    if [r["x"] for r in new["rows"]] != [r["x"] for r in old["rows"]]:
        raise RenderError("composition and composition_0.3.64 measured different rows: rerun both")
    differ = [f"{COMPOSITION_FAMILIES[b['family']]} {b['x']}{' ' + b['where'] if b['where'] else ''}: "
              f"{num(b['gcache_x_vs_plain_x'], '.4f')}" + (", the orders differ" if b["orders"] == "differ" else "")
              for a, b in zip(new["rows"], old["rows"])
              if num(a["gcache_x_vs_plain_x"], ".4f") != num(b["gcache_x_vs_plain_x"], ".4f")
              or a["orders"] != b["orders"]]
    differ += [f"GCache vs plain on {COMPOSITION_FAMILIES[f]}: {num(old['gcache_vs_plain'][f], '.4f')}"
               for f in ("flux", "wan")
               if num(new["gcache_vs_plain"][f], ".4f") != num(old["gcache_vs_plain"][f], ".4f")]
    if not differ:
        return "ComfyUI 0.3.64 gave the same figures to the 4 decimals shown"
    return "on ComfyUI 0.3.64 these differed: " + "; ".join(differ)


# ------------------------------------------------------------------------------------------------ search.md
@block("search_excerpt.output")
def search_excerpt_output(results) -> str:
    return fenced("\n".join(results("search_excerpt")["stdout"]))


# ------------------------------------------------------------------------------------------------ how-it-works.md
def weights_facts() -> dict:
    from safetensors import safe_open
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference_model",
                        "tiny_dit_digits.safetensors")
    with safe_open(path, "pt") as f:
        params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        meta = f.metadata()
    return {"params": params, "bytes": os.path.getsize(path), "meta": meta}


@block("reference.size")
def reference_size(results) -> str:
    f = weights_facts()
    return f"{num(f['params'] / 1e6, '.2f')} M parameters, {num(f['bytes'] / 1e6, '.1f')} MB of fp16 safetensors"


@block("reference.training")
def reference_training(results) -> str:
    m = weights_facts()["meta"]
    return (f"after {int(m['train_steps']):,} steps of batch {m['batch']} "
            f"({num(float(m['train_seconds']) / 60, '.1f')} min), final flow-matching loss "
            f"{num(float(m['final_loss']), '.3f')}")




@block("choice_regret.prose")
def choice_regret_prose(results) -> str:
    """bench/choice_regret.py's own output file (a long run, not repeated by bench/runs.py): a dated measurement of
    the commit it ran at, said as such."""
    rec = results.record("choice_regret")
    rules, rows = rec["rules"], rec["rows"]
    old, new = rules["z=2"]["regret"], rules["z=0"]["regret"]
    better = sum(r["regret"]["z=0"] < r["regret"]["z=2"] for r in rows)
    worse = sum(r["regret"]["z=0"] > r["regret"]["z=2"] for r in rows)
    ks = sorted({r["K"] for r in rows})
    budgets = sorted({r["budget"] for r in rows})
    lo, hi = (int(x) for x in rec["search_seeds"][0].split("-"))
    return (f"{len(rec['search_seeds'])} sets of {hi - lo + 1} search seeds, K = {ks[0]} to {ks[-1]} of {rec['N']}, "
            f"budgets {' and '.join(str(b) for b in budgets)}; {rec['date']}, commit {rec['git_commit'][:7]}): it "
            "threw away better masks more often than it saved a lucky one, with a median regret of "
            f"{num(old['median'], '.2f')} dB against the best mask each search evaluated, {num(old['mean'], '.2f')} dB "
            f"on average and {num(old['worst'], '.2f')} dB at worst, where no margin had {num(new['median'], '.2f')}, "
            f"{num(new['mean'], '.2f')} and {num(new['worst'], '.2f')} dB (better in {better} of {len(rows)} searches, "
            f"worse in {worse}, tied in {len(rows) - better - worse})")


# ------------------------------------------------------------------------------------------------ self-check margins
MARGIN_FAMILIES = {"flux": "Flux", "hunyuan_video": "HunyuanVideo", "lumina2": "Lumina 2", "ltxv": "LTXV",
                   "hidream": "HiDream", "chroma": "Chroma", "cosmos_predict2": "Cosmos Predict2",
                   "qwen_image": "Qwen-Image", "ltx2": "LTX-2", "z_image": "Z-Image", "krea2": "Krea 2",
                   "joyimage": "JoyImage"}
MARGIN_SIZES = {"flux_4096_tokens_bfloat16": "Flux, 4096 image tokens (hidden 256, 128×128 latent), bfloat16",
                "flux_float32_stack_bfloat16_head": "Flux, float32 stack before a bfloat16 head (hidden 256, 64×64)",
                "flux_output_cast_to_bfloat16": "Flux, float32 stack and head, output cast to bfloat16 outside any "
                                                "layer"}


def _margin_cell(r: dict) -> str:
    """'12.3× (element 12.3×, group 45.6×)'; 'exact' where the replay equalled the computed output."""
    if r["result"] != "pass":
        return f"**{r['result']}**"
    if r["margin"] is None:
        return "exact"
    parts = [f"{k} {num(r[f'{k}_margin'], '.1f')}×" for k in ("element", "group") if r[f"{k}_margin"] is not None]
    return f"{num(r['margin'], '.1f')}× ({', '.join(parts)})"


def _margins_table(results, run: str) -> str:
    r = results(run)
    dtypes = ("float32", "bfloat16", "float16")
    rows = [(MARGIN_FAMILIES.get(fam, fam), *(_margin_cell(by[d]) if d in by else "" for d in dtypes))
            for fam, by in r["families"].items()]
    rows += [(MARGIN_SIZES.get(name, name), *(_margin_cell(row) if d == row["dtype"] else "" for d in dtypes))
             for name, row in r["sizes"].items()]  # in the column of the dtype its allowance was measured in
    return table(["correct model (ComfyUI " + r["comfyui"] + ")", *dtypes], rows)


for _run in ("selfcheck_margins", "selfcheck_margins_0.3.64"):
    block(f"{_run}.table")(lambda results, _run=_run: _margins_table(results, _run))


# ------------------------------------------------------------------------------------------------ how-it-works.md
RANKING_RUNS = ("auto_ranking", "auto_ranking_flux", "auto_ranking_wan")  # the reference model; the trained ones


def ranking_models(results):
    for run in RANKING_RUNS:
        for name, res in results(run)["models"].items():
            yield name, res


def _pair(r) -> str:
    return f"{r['forecaster']} on {', '.join(map(str, r['steps']))}"


@block("auto_ranking.table")
def auto_ranking_table(results) -> str:
    out = []
    for name, res in ranking_models(results):
        for k in res["ks"]:
            best = k["best"]
            c = k["checked"]
            out.append([name, k["K"], len(k["rows"]), db(k["spearman_score"], "+.2f"),
                        f"{db(k['auto_psnr'])} ({k['auto_forecaster']})",
                        f"{db(c['psnr'])} ({c['forecaster']}{'' if len(c['steps']) == k['K'] else ', K − 1'})",
                        f"{db(best['psnr'])} ({_pair(best)})", db(k["fewer_steps_psnr"])])
    return table(["model", "K", "pairs", "Spearman (score, PSNR)", "auto before (instant)", "auto now (checked)",
                  "best pair measured", "fewer steps"], out)


@block("auto_ranking.sizes")
def auto_ranking_sizes(results) -> str:
    return "; ".join(f"{name}: {res['pairs']} held-out pairs, {min(len(k['rows']) for k in res['ks'])}–"
                     f"{max(len(k['rows']) for k in res['ks'])} (mask, forecaster) pairs per K"
                     for name, res in ranking_models(results))


@block("auto_ranking.misranked")
def auto_ranking_misranked(results) -> str:
    parts = []
    for name, res in ranking_models(results):
        k = min(res["ks"], key=lambda k: k["K"])
        m = k["misranked"][0]
        parts.append(f"{name}, K = {k['K']}: {_pair(m)} ({m['mask']}) ranked {m['score_rank']} by the score and "
                     f"{m['psnr_rank']} by PSNR ({db(m['psnr'])} dB)")
    return "; ".join(parts)


@block("auto_ranking.within")
def auto_ranking_within(results) -> str:
    """Per model: the median Spearman of the score within one forecaster (masks only) against over every pair."""
    import statistics
    parts = []
    for name, res in ranking_models(results):
        within = [v for k in res["ks"] for v in k["spearman_by_forecaster"].values() if v is not None]
        overall = [k["spearman_score"] for k in res["ks"] if k["spearman_score"] is not None]
        parts.append(f"{name} {num(statistics.median(within), '+.2f')} within a forecaster, "
                     f"{num(statistics.median(overall), '+.2f')} over all pairs")
    return "; ".join(parts)


@block("auto_ranking.forecaster_gap")
def auto_ranking_forecaster_gap(results) -> str:
    """Per model: on auto's own mask, the best forecaster measured minus auto's pick, at each K (dB)."""
    parts = []
    for name, res in ranking_models(results):
        gaps = []
        for k in res["ks"]:
            on_mask = [r for r in k["rows"] if r["steps"] == k["auto_steps"]]
            best = max(on_mask, key=lambda r: r["psnr"])
            gaps.append(f"K = {k['K']} {best['forecaster']} {num(best['psnr'] - k['auto_psnr'], '+.2f')}")
        parts.append(f"{name}: " + ", ".join(gaps))
    return "; ".join(parts)


@block("auto_ranking.mask_gap")
def auto_ranking_mask_gap(results) -> str:
    """Per model at its lowest K: auto's forecaster on the local-weight reuse DP mask minus on auto's theory mask."""
    parts = []
    for name, res in ranking_models(results):
        k = min(res["ks"], key=lambda k: k["K"])
        local = next((r for r in k["rows"] if r["mask"] == "dp_reuse_local"
                      and r["forecaster"] == k["auto_forecaster"]), None)
        if local is None:  # the local mask is auto's own mask at this K
            continue
        parts.append(f"{name}, K = {k['K']}: steps {', '.join(map(str, k['auto_steps']))} → "
                     f"{', '.join(map(str, local['steps']))}, {num(local['psnr'] - k['auto_psnr'], '+.2f')} dB")
    return "; ".join(parts)


SEEDS_RUNS = ("auto_seeds_flux", "auto_seeds_wan")  # bench/auto_seeds.py: auto over several run-1 inputs


def _spread(s) -> str:
    return f"{db(s['mean'])} ({db(s['min'])}–{db(s['max'])})"


@block("auto_seeds.table")
def auto_seeds_table(results) -> str:
    out = []
    for run in SEEDS_RUNS:
        r = results(run)
        for k in r["ks"]:
            out.append([r["model"], k["K"], _spread(k["instant"]), _spread(k["checked"]), _spread(k["checked_io"]),
                        _spread(k["best"]), db(k["fewer_steps"])])
    return table(["model", "K", "auto before (instant)", "auto now (checked)",
                  f"checked at io share {num(results(SEEDS_RUNS[0])['io_share_checked'])}",
                  "best candidate", "fewer steps"], out)


@block("auto_seeds.sizes")
def auto_seeds_sizes(results) -> str:
    return "; ".join(f"{results(run)['model']}: {results(run)['runs']} run-1 inputs, {results(run)['pairs']} "
                     "held-out pairs" for run in SEEDS_RUNS)


@block("auto_seeds.monotone")
def auto_seeds_monotone(results) -> str:
    """Per model: in how many (run 1, next K) steps the checked pick's PSNR did not fall, and the instant one's."""
    parts = []
    for run in SEEDS_RUNS:
        r = results(run)
        c, i = r["monotone"]["checked"], r["monotone"]["instant"]
        parts.append(f"{r['model']}: {c[0]} of {c[1]} (instant: {i[0]} of {i[1]})")
    return "; ".join(parts)


@block("auto_seeds.first_run")
def auto_seeds_first_run(results) -> str:
    """The other benches' run 1 (run 0 here) against the mean over every run 1, for the checked pick, per K (Wan)."""
    r = results("auto_seeds_wan")
    run0 = r["per_run"][0]
    return ", ".join(f"K = {k['K']} {db(k0['checked']['psnr'])} against {db(k['checked']['mean'])}"
                     for k, k0 in zip(r["ks"], run0["ks"]))


@block("auto_seeds.own_alpha")
def auto_seeds_own_alpha(results) -> str:
    parts = []
    for run in SEEDS_RUNS:
        r = results(run)
        for k in r.get("own_alpha", []):
            parts.append(f"{r['model']}, K = {k['K']}: {db(k['fitted_run1'])} / {db(k['fitted_own'])} / "
                         f"{db(k['linear'])}")
    return "; ".join(parts)


@block("auto_seeds.instant_picks")
def auto_seeds_instant_picks(results) -> str:
    """Per model: which forecaster auto's instant policy used, over every (run 1, K)."""
    from collections import Counter
    parts = []
    for run in SEEDS_RUNS:
        r = results(run)
        got = Counter(k["instant"]["forecast"] for run1 in r["per_run"] for k in run1["ks"])
        total = sum(got.values())
        parts.append(f"{r['model']}: " + ", ".join(f"{f} {n} of {total}" for f, n in got.most_common()))
    return "; ".join(parts)


@block("auto_ranking.goal_gap")
def auto_ranking_goal_gap(results) -> str:
    """Per model at each K ≤ N/4: auto's checked pick minus the best pair the study measured (dB)."""
    parts = []
    for name, res in ranking_models(results):
        n = results(RANKING_RUNS[0])["steps"]
        gaps = [f"K = {k['K']} {num(k['checked']['psnr'] - k['best']['psnr'], '+.2f')}" for k in res["ks"]
                if k["K"] <= n // 4]
        parts.append(f"{name}: " + ", ".join(gaps))
    return "; ".join(parts)
