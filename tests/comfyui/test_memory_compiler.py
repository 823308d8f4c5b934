"""ComfyUI's memory compiler (0.34+) against a stand-in `comfy.model_prefetch` with its names, in real ComfyUI on
whichever tree COMFYUI_PATH points to (neither 0.3.64 nor 0.33 has the compiler; no real 0.34+ tree was tried).

The stand-in: `malloc_graph_enabled(device)` reads `args.disable_comfy_compiler` on every call (as the real one
does), `pause_malloc_graph()` counts its pauses, and a DIFFUSION_MODEL wrapper plays the compiler's recording around
the model's forward while it is enabled: a torch dispatch mode notes every new storage made while not paused, and
after the forward (its output copied out, as MiniMax H3's forward does) a storage of the recording that is still
alive is what the real compiler aborts on. A plain model leaves none.
"""
import contextlib
import gc
import sys
import types

import pytest

from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import torch  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import comfy.cli_args  # noqa: E402
import nodes as comfy_nodes  # noqa: E402
from comfy.patcher_extension import WrappersMP  # noqa: E402

import tiny_models as tm  # noqa: E402

from gcache.core.policy import Policy  # noqa: E402
from gcache.nodes.modes import apply as apply_mode, profile as profile_mode  # noqa: E402
from gcache.nodes.patching import hooks, memory_compiler  # noqa: E402

N = 6
MASK = [1, 0, 1, 0, 0, 1]


class StandIn:
    """What the stand-in module saw: the flag at each forward, pauses, recorded forwards and their survivors."""

    def __init__(self):
        self.paused = 0
        self.pauses = 0
        self.flags: list = []
        self.recorded = 0
        self.survivors: list = []

    def malloc_graph_enabled(self, device):
        return not comfy.cli_args.args.disable_comfy_compiler

    def pause_malloc_graph(self, sync=False):
        @contextlib.contextmanager
        def paused():
            self.paused += 1
            self.pauses += 1
            try:
                yield
            finally:
                self.paused -= 1
        return paused()

    def module(self):
        mod = types.ModuleType("comfy.model_prefetch")
        mod.malloc_graph_enabled = self.malloc_graph_enabled
        mod.pause_malloc_graph = self.pause_malloc_graph
        return mod


class Recording(TorchDispatchMode):
    def __init__(self, standin):
        super().__init__()
        self.standin = standin
        self.made: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.standin.paused:
            given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if torch.is_tensor(t)}
            self.made += [StorageWeakRef(t.untyped_storage()) for t in tree_leaves(out)
                          if torch.is_tensor(t) and t.numel() and t.untyped_storage().data_ptr() not in given]
        return out


def recorded(model, standin):
    """`model` with the stand-in's recording around its diffusion model's forward."""
    def recording(executor, *args, **kwargs):
        standin.flags.append(comfy.cli_args.args.disable_comfy_compiler)
        if not standin.malloc_graph_enabled(args[0].device):
            return executor(*args, **kwargs)
        mode = Recording(standin)
        with mode:
            out = executor(*args, **kwargs)
        result = out.clone()
        del out
        gc.collect()
        standin.recorded += 1
        standin.survivors.append(sum(not w.expired() for w in mode.made))
        return result
    m = model.clone()
    m.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, "standin_recording", recording)
    return m


@pytest.fixture()
def standin(monkeypatch):
    s = StandIn()
    monkeypatch.setitem(sys.modules, "comfy.model_prefetch", s.module())
    monkeypatch.setattr(comfy.cli_args.args, memory_compiler.FLAG, False, raising=False)
    return s


@pytest.fixture(scope="module")
def flux():
    return tm.flux()


def ksample(model, pos, neg, lat, cfg=3.0):
    return comfy_nodes.common_ksampler(model, 0, N, cfg, "euler", "simple", pos, neg, {"samples": lat})[0]["samples"]


def apply(model, mask):
    return hooks.patch_model(model, apply_mode.apply_config(model, Policy(list(mask))))


def test_a_run_that_skips_turns_the_compiler_off_and_back_on(flux, standin, caplog):
    m, pos, neg, lat = flux
    with caplog.at_level("INFO", logger="gcache"):
        out = ksample(recorded(apply(m, MASK), standin), pos, neg, lat)
    assert standin.flags == [True] * N and standin.recorded == 0  # off for every forward of the run
    assert comfy.cli_args.args.disable_comfy_compiler is False     # and back on after it
    assert "memory compiler is off for this run" in caplog.text and torch.isfinite(out).all()
    plain = ksample(recorded(m, standin), pos, neg, lat)  # without GCache: untouched, and nothing survives
    assert standin.flags[N:] == [False] * N and standin.recorded == N and standin.survivors == [0] * N
    assert torch.equal(out, ksample(apply(m, MASK), pos, neg, lat)) and not torch.equal(out, plain)


def test_a_users_own_flag_is_respected(flux, standin, caplog):
    m, pos, neg, lat = flux
    comfy.cli_args.args.disable_comfy_compiler = True  # --disable-comfy-compiler
    with caplog.at_level("INFO", logger="gcache"):
        ksample(recorded(apply(m, MASK), standin), pos, neg, lat)
        ksample(recorded(apply(m, [1] * N), standin), pos, neg, lat)
    assert standin.flags == [True] * 2 * N and comfy.cli_args.args.disable_comfy_compiler is True
    assert caplog.text.count("memory compiler is off (--disable-comfy-compiler); GCache leaves it off") == 2


@pytest.mark.parametrize("pause", [True, False])
def test_runs_that_compute_every_step_keep_the_compiler_and_allocate_outside_it(flux, standin, tmp_path, caplog,
                                                                               monkeypatch, pause):
    """Profile (and an all-ones policy) keep the compiler on; what GCache keeps across steps (the profile's history,
    the engine's snapshots) is made under pause_malloc_graph, so nothing of the recording survives it. Without the
    pause (pause=False: GCache's hook emptied) the same runs leave survivors: the check can fail."""
    m, pos, neg, lat = flux
    if not pause:
        found = memory_compiler.find()
        monkeypatch.setattr(memory_compiler, "find", lambda: memory_compiler.Compiler(
            found.enabled, contextlib.nullcontext, found.args))
    path = str(tmp_path / "p.profile.safetensors")
    with caplog.at_level("INFO", logger="gcache"):
        profiled = ksample(recorded(hooks.patch_model(m, profile_mode.profile_config(m, path)), standin), pos, neg, lat)
    # the compiler on for every step's forward; off for the self-check's one replayed call (its stack is skipped)
    assert standin.flags == [False] * N + [True] and standin.recorded == N
    assert comfy.cli_args.args.disable_comfy_compiler is False  # and back on after that call
    assert "memory compiler stays on for this run (every step computes)" in caplog.text
    assert (sum(standin.survivors) == 0) == pause, standin.survivors
    assert (standin.pauses > 0) == pause
    assert torch.equal(profiled, ksample(m, pos, neg, lat))


def test_overlapping_runs_put_the_flag_back_once():
    args = types.SimpleNamespace(**{memory_compiler.FLAG: False})
    holds = memory_compiler._Holds()
    holds.acquire(args)
    holds.acquire(args)
    assert args.disable_comfy_compiler is True and holds.user_flag(args) is False
    holds.release(args)
    assert args.disable_comfy_compiler is True  # the other run still skips
    holds.release(args)
    assert args.disable_comfy_compiler is False


def test_this_tree_has_no_memory_compiler(flux, caplog):
    """0.3.64 has no comfy.model_prefetch, 0.33 one without the compiler's names: found as absent, nothing said."""
    m, pos, neg, lat = flux
    assert memory_compiler.find() is None
    with caplog.at_level("DEBUG", logger="gcache"):
        ksample(apply(m, MASK), pos, neg, lat)
    assert "memory compiler" not in caplog.text
