"""ComfyUI's memory compiler, both generations, against stand-in `comfy.model_prefetch` modules with their names, in
real ComfyUI on whichever tree COMFYUI_PATH points to (neither 0.3.64 nor 0.33 has the compiler; no real tree with it
was tried).

The stand-in: `malloc_graph_enabled(device)` reads `args.disable_comfy_compiler` on every call (as the real one
does), `pause_malloc_graph()` counts its pauses (the newest generation; the per-module graph generation has none),
and a DIFFUSION_MODEL wrapper plays the compiler's recording around the model's forward while it is enabled: a torch
dispatch mode notes every new storage made while not paused, and after the forward (its output copied out, as
MiniMax H3's forward does) a storage of the recording that is still alive is what the real compiler aborts on. A
plain model leaves none. On 0.33, whose LTX-2 block loop calls comfy.model_prefetch.prefetch_queue_pop before each
block and once after the last, the recording also notes which block made each storage.
"""
import contextlib
import gc
import sys
import types

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import comfy.cli_args  # noqa: E402
import tiny_models as tm  # noqa: E402
import torch  # noqa: E402
from comfy.patcher_extension import WrappersMP  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from gcache.core.policy import Policy  # noqa: E402
from gcache.nodes.modes import apply as apply_mode  # noqa: E402
from gcache.nodes.modes import profile as profile_mode
from gcache.nodes.patching import hooks, memory_compiler  # noqa: E402

N = 6
MASK = [1, 0, 1, 0, 0, 1]


class StandIn:
    """What the stand-in module saw: the flag at each forward, pauses, recorded forwards and their survivors."""

    def __init__(self, has_pause=True):
        self.has_pause = has_pause
        self.block = None  # the block the forward is in (LTX-2 on 0.33: see block_boundaries)
        self.mode = None   # the recording of the forward in progress
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
        if self.has_pause:
            mod.pause_malloc_graph = self.pause_malloc_graph
        return mod


class Recording(TorchDispatchMode):
    def __init__(self, standin):
        super().__init__()
        self.standin = standin
        self.made: list = []
        self.by_block: dict = {}  # block index -> storages made there, not paused

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.standin.paused:
            given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if torch.is_tensor(t)}
            new = [StorageWeakRef(t.untyped_storage()) for t in tree_leaves(out)
                   if torch.is_tensor(t) and t.numel() and t.untyped_storage().data_ptr() not in given]
            self.made += new
            if self.standin.block is not None:
                self.by_block.setdefault(self.standin.block, []).extend(new)
        return out


def recorded(model, standin):
    """`model` with the stand-in's recording around its diffusion model's forward."""
    def recording(executor, *args, **kwargs):
        standin.flags.append(comfy.cli_args.args.disable_comfy_compiler)
        if not standin.malloc_graph_enabled(next(t for t in tree_leaves(args[0]) if torch.is_tensor(t)).device):
            return executor(*args, **kwargs)
        mode = standin.mode = Recording(standin)
        try:
            with mode:
                out = executor(*args, **kwargs)
        finally:
            standin.mode = None
        result = type(out)(t.clone() for t in out) if isinstance(out, (list, tuple)) else out.clone()
        del out
        gc.collect()
        standin.recorded += 1
        standin.survivors.append(sum(not w.expired() for w in mode.made))
        return result
    # the stand-in is ComfyUI's own compiler, whose recording the self-check knows (foreign.KNOWN_SAFE): a wrapper of
    # another node's module would make the check "not checked" (it would see the replay), and no call replays
    recording.__module__ = "comfy.memory_compiler_standin"
    m = model.clone()
    m.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, "standin_recording", recording)
    return m


@pytest.fixture()
def standin(monkeypatch):
    s = StandIn()
    monkeypatch.setitem(sys.modules, "comfy.model_prefetch", s.module())
    monkeypatch.setattr(comfy.cli_args.args, memory_compiler.FLAG, False, raising=False)
    return s


@pytest.fixture()
def standin_without_pause(monkeypatch):
    """The per-module graph generation: the compiler and its switch, no pause_malloc_graph."""
    s = StandIn(has_pause=False)
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
    # the compiler on for every step's forward; off for the self-check's replayed call and its nudged replay (the
    # stack is skipped in both)
    assert standin.flags == [False] * N + [True] * 2 and standin.recorded == N
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


# ------------------------------------------------------------------------------ the per-module graph (no pause)
def test_a_compiler_without_a_pause_is_found(standin_without_pause):
    api = memory_compiler.find()
    assert api is not None and api.pause is None and api.args is comfy.cli_args.args


@pytest.mark.parametrize("run", ["skips", "profile", "all ones"])
def test_a_compiler_without_a_pause_is_off_for_every_block_patched_run(flux, standin_without_pause, tmp_path,
                                                                       caplog, run):
    """Nothing GCache keeps across steps can be made outside its recording: off for the whole run, whether it
    skips or computes every step, and back on after it; nothing of a recording survives (there is none)."""
    m, pos, neg, lat = flux
    s = standin_without_pause
    patched = {"skips": lambda: apply(m, MASK), "all ones": lambda: apply(m, [1] * N),
               "profile": lambda: hooks.patch_model(m, profile_mode.profile_config(
                   m, str(tmp_path / "p.profile.safetensors")))}[run]()
    with caplog.at_level("INFO", logger="gcache"):
        out = ksample(recorded(patched, s), pos, neg, lat)
    forwards = len(s.flags)
    assert forwards >= N and s.flags == [True] * forwards and s.recorded == 0, s.flags
    assert comfy.cli_args.args.disable_comfy_compiler is False
    assert "memory compiler is off for this run: this ComfyUI's compiler has no pause_malloc_graph" in caplog.text
    assert torch.isfinite(out).all()
    plain = ksample(recorded(m, s), pos, neg, lat)  # without GCache: on, and nothing survives
    assert s.flags[forwards:] == [False] * N and s.recorded == N and s.survivors == [0] * N
    if run != "skips":
        assert torch.equal(out, plain)


def test_a_compiler_without_a_pause_respects_the_users_flag(flux, standin_without_pause, caplog):
    m, pos, neg, lat = flux
    comfy.cli_args.args.disable_comfy_compiler = True
    with caplog.at_level("INFO", logger="gcache"):
        ksample(recorded(apply(m, MASK), standin_without_pause), pos, neg, lat)
    assert standin_without_pause.flags == [True] * N and comfy.cli_args.args.disable_comfy_compiler is True
    assert "memory compiler is off (--disable-comfy-compiler); GCache leaves it off" in caplog.text


# ------------------------------------------------------------------------------ LTX-2's joint stream (0.33)
@pytest.fixture()
def block_boundaries(monkeypatch, standin):
    """0.33's LTX-2 loop asks comfy.model_prefetch.prefetch_queue_pop (the real module, which its code holds) before
    each block and once after the last: the stand-in learns there which block the forward is in. Before block 2 it
    notes how many storages block 0 made (not paused) are still alive: block 0's own output is gone by then (block 1
    has replaced it), so what is left is something held past the block that made it, which a newest-generation
    compiler (recording block by block) aborts on. Returns those counts, one per forward."""
    try:
        import comfy.model_prefetch as real
        import tiny_video_models_033  # noqa: F401  (LTX-2 is new in 0.33)
    except ImportError:
        pytest.skip("this ComfyUI has no LTX-2 or no comfy.model_prefetch")
    original, held_over = real.prefetch_queue_pop, []

    def pop(queue, device, module, *a, **k):
        out = original(queue, device, module, *a, **k)
        standin.block = None if module is None else 0 if standin.block is None else standin.block + 1
        if standin.block == 2 and standin.mode is not None:
            gc.collect()
            held_over.append(sum(not w.expired() for w in standin.mode.by_block.get(0, [])))
        return out
    monkeypatch.setattr(real, "prefetch_queue_pop", pop)
    return held_over


def ltx2_with_3_blocks(tmpdir):
    """tiny_video_models_033.ltx2 with 3 blocks (block 0's output is gone before block 2)."""
    import tiny_video_models_033 as tvm
    build = tvm._patcher_scaled

    def three(model_config_cls, cfg, seed, scale):
        return build(model_config_cls, {**cfg, "num_layers": 3}, seed, scale)
    tvm._patcher_scaled = three
    try:
        return tvm.ltx2(tmpdir)
    finally:
        tvm._patcher_scaled = build


def test_ltx2s_joint_stream_is_made_outside_the_recording(standin, block_boundaries, tmp_path):
    """A Profile run of LTX-2 computes every step with the compiler on: the video + audio tensor GCache packs at
    block 0 (its stack input, held to the last block) is made under the pause, so nothing block 0 made is alive at
    block 2 (as without GCache)."""
    m, pos, neg, lat = ltx2_with_3_blocks(str(tmp_path))
    assert len(m.model.diffusion_model.transformer_blocks) == 3
    ksample(recorded(m, standin), pos, neg, lat)  # without GCache: nothing held over
    assert block_boundaries == [0] * N and standin.recorded == N
    path = str(tmp_path / "ltx2.profile.safetensors")
    ksample(recorded(hooks.patch_model(m, profile_mode.profile_config(m, path)), standin), pos, neg, lat)
    assert standin.recorded == 2 * N and standin.flags[N:] == [False] * N + [True] * 2  # the replay, nudged too
    assert block_boundaries == [0] * 2 * N and standin.survivors == [0] * 2 * N
