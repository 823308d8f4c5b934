"""The self-check's margins on correct models: each statistic's allowance over its error, per family and dtype.

Every family of tests/comfyui/test_selfcheck.py's correct-adapter test (tiny random-weight models from ComfyUI's own
classes; the 0.33 families only on a 0.33 tree) in float32, bfloat16 and float16, sampled as GCache Profile's run 1
(6 euler steps, cfg 3; the check replays the last step), and three rows at the sizes issue 47 named: Flux at 4096
image tokens in bfloat16 (hidden 256, a 128x128 latent, 2 steps), Flux's float32 stack before a bfloat16 head
(hidden 256, a 64x64 latent), and a float32 Flux whose output is cast to bfloat16 after its head outside any layer.
A margin is the allowance (SAFETY times the floor measured by the nudged replay, core/selfcheck.py) over the error:
the smaller of the element and the group statistic's is the row's; inf where the replay was exact.

    COMFYUI_PATH=/path/to/ComfyUI python -m gcache.bench.selfcheck_margins    # about 6 min on one core

Ends with one JSON line.
"""
from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile
import textwrap
import types

from .cli import BenchParser, Progress, require_comfyui, run_main

DTYPES = ("float32", "bfloat16", "float16")
FAMILIES = ("flux", "hunyuan_video", "lumina2", "ltxv", "hidream", "chroma", "cosmos_predict2", "qwen_image", "ltx2",
            "z_image", "krea2", "joyimage")
SIZES = ("flux_4096_tokens_bfloat16", "flux_float32_stack_bfloat16_head", "flux_output_cast_to_bfloat16")


def recompiled(func, source: str):
    """`func` with its body compiled from `source` (its own source edited, as an update of the tree might change it),
    bound to the same module globals, defaults and closure. Only the function is compiled: no module code runs, and
    no exec() (the Comfy Registry's validator warns on it, tests/test_registry_rules.py)."""
    code = compile(textwrap.dedent(source), inspect.getsourcefile(func), "exec")
    body = next(c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == func.__name__)
    new = types.FunctionType(body, func.__globals__, func.__name__, func.__defaults__,
                             func.__closure__ if body.co_freevars == func.__code__.co_freevars else None)
    new.__kwdefaults__ = func.__kwdefaults__
    return new


def builders(folder: str, new: bool) -> dict:
    import tiny_image_models as tim
    import tiny_models as tm
    import tiny_video_models as tvm
    out = {"flux": tm.flux, "hunyuan_video": lambda: tm.hunyuan_video(folder), "lumina2": tm.lumina2,
           "ltxv": lambda: tvm.ltxv(folder), "hidream": lambda: tim.hidream(folder),
           "chroma": lambda: tim.chroma(folder), "cosmos_predict2": lambda: tvm.cosmos_predict2(folder),
           "qwen_image": lambda: tim.qwen_image(folder)}
    if new:
        import tiny_image_models_033 as tim33
        import tiny_video_models_033 as tvm33
        out.update(ltx2=lambda: tvm33.ltx2(folder), z_image=lambda: tim33.z_image(folder),
                   krea2=lambda: tim33.krea2(folder), joyimage=lambda: tim33.joyimage(folder))
    return out


def margins(v: dict) -> dict:
    """The verdict's figures and each statistic's margin (allowance over error; None where the error is 0)."""
    def over(err, tol):
        return None if not err else round(tol / err, 2)
    element = over(v["error"], v["tolerance"]) if v["statistic"] == "element" else None
    group = over(v["group_error"], v["group_tolerance"])
    shown = [m for m in (element, group) if m is not None]
    return {"result": v["result"], "dtype": v["dtype"], "statistic": v["statistic"], "error": v["error"],
            "tolerance": v["tolerance"], "group_error": v["group_error"], "group_tolerance": v["group_tolerance"],
            "element_margin": element, "group_margin": group, "margin": min(shown) if shown else None}


def main(argv=None) -> dict:
    ap = BenchParser("gcache.bench.selfcheck_margins", __doc__)
    ap.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    ap.add_argument("--no-sizes", action="store_true", help="leave out the three rows at issue 47's sizes")
    a = ap.parse_args(argv)
    sys.path.insert(0, require_comfyui(ap))
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "comfyui"))
    import comfy.cli_args
    import torch
    comfy.cli_args.args.cpu = not torch.cuda.is_available()
    torch.set_num_threads(1)
    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False
    import comfyui_version
    version = str(comfyui_version.__version__)
    new = tuple(int(p) for p in version.split(".")[:2]) >= (0, 33)

    out = {"comfyui": version, "families": {}, "sizes": {}}
    with tempfile.TemporaryDirectory(prefix="gcache-margins-") as files:
        built = builders(files, new)
        todo = [(f, d) for f in a.families if f in built for d in a.dtypes]
        sizes = [] if a.no_sizes else list(SIZES)
        progress = Progress(len(todo) + len(sizes), "self-check margins", expected_s=8.0 * len(todo) + 120.0)
        for fam, dtype in todo:
            m, pos, neg, lat = built[fam]()
            if dtype != "float32":
                dm = m.model.diffusion_model
                dm.to(getattr(torch, dtype))
                dm.dtype = getattr(torch, dtype)
            row = margins(verdict(m, pos, neg, lat, files, steps=6, cfg=3.0))
            out["families"].setdefault(fam, {})[dtype] = row
            progress.step(f"{fam} {dtype}: {row['result']}, margin {row['margin']}")
        for name in sizes:
            row = margins(size_case(name, files))
            out["sizes"][name] = row
            progress.step(f"{name}: {row['result']}, margin {row['margin']}")
    every = [r["margin"] for rows in out["families"].values() for r in rows.values()] + \
        [r["margin"] for r in out["sizes"].values()]
    found = [m for m in every if m is not None]
    out["smallest_margin"] = min(found) if found else None
    out["all_passed"] = all(r["result"] == "pass" for rows in out["families"].values() for r in rows.values()) and \
        all(r["result"] == "pass" for r in out["sizes"].values())
    print(json.dumps(out, allow_nan=False, default=lambda x: None))
    return out


def verdict(m, pos, neg, lat, folder: str, steps: int, cfg: float) -> dict:
    """Run 1 as GCache Profile makes it (no record file): the run's verdict, from its profile's meta."""
    import nodes as comfy_nodes

    from ..core.profile import Profile
    from ..core.verdicts import checks_of
    from ..nodes.modes import profile as profile_mode
    from ..nodes.patching import hooks
    path = os.path.join(folder, f"p{len(os.listdir(folder))}.profile.safetensors")
    patched = hooks.patch_model(m, profile_mode.profile_config(m, path, folder=""))
    comfy_nodes.common_ksampler(patched, 0, steps, cfg, "euler", "simple", pos, neg, {"samples": lat})
    return checks_of(Profile.load(path).meta)[0]


def size_case(name: str, folder: str) -> dict:
    import comfy.ldm.flux.model as flux_model
    import tiny_models as tm
    import torch
    if name == "flux_4096_tokens_bfloat16":
        m, pos, neg, lat = tm.flux(hidden_size=256, depth=1, side=128)
        m.model.diffusion_model.to(torch.bfloat16)
        m.model.diffusion_model.dtype = torch.bfloat16
        return verdict(m, pos, neg, lat, folder, steps=2, cfg=1.0)
    m, pos, neg, lat = tm.flux(hidden_size=256, depth=1, side=64)
    if name == "flux_float32_stack_bfloat16_head":
        head = m.model.diffusion_model.final_layer
        head.to(torch.bfloat16)
        head.register_forward_pre_hook(lambda mod, args: tuple(x.to(torch.bfloat16) if torch.is_tensor(x) else x
                                                               for x in args))
        head.register_forward_hook(lambda mod, args, out: out.float())
        return verdict(m, pos, neg, lat, folder, steps=2, cfg=3.0)
    original = flux_model.Flux.forward_orig  # the model's own code with one line added (restored afterwards)
    src = inspect.getsource(original)
    line = next(x for x in src.splitlines(keepends=True) if x.startswith("        img = self.final_layer(img, vec"))
    cast = line + "        img = img.to(torch.bfloat16)\n"
    flux_model.Flux.forward_orig = recompiled(original, src.replace(line, cast, 1))
    try:
        return verdict(m, pos, neg, lat, folder, steps=3, cfg=3.0)
    finally:
        flux_model.Flux.forward_orig = original


if __name__ == "__main__":
    sys.exit(run_main(main, "gcache.bench.selfcheck_margins"))
