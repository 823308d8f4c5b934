"""Other nodes' block patches beside GCache's, and the gate's robustness (headless: a fake block loop shaped like
ComfyUI's dit loops, GCache's patches, and the APPLY_MODEL wrapper's steps from hooks.py).

The oracle is the same loop without GCache: on a computed step a call's output is the loop's, with whatever patches
the call has; on a skipped step it is h + the true δ of the same branch's last computed call (same patches)."""
import functools

import pytest
import torch

from gcache.core.engine import ResidualCache
from gcache.nodes.patching import foreign
from gcache.nodes.patching.adapters import BlockSlot, Stack
from gcache.nodes.patching.runtime import RunState, Variant, activate, deactivate, make_dit_patch
from gcache.nodes.patching.steps import StepTracker

torch.set_num_threads(1)
OWNER = "g"
N_BLOCKS = 4
STACK = Stack("double_block", "blocks", "img")
SLOTS = [BlockSlot(STACK, i, str(i), i == 0, i == N_BLOCKS - 1) for i in range(N_BLOCKS)]
KEYS = [("double_block", i) for i in range(N_BLOCKS)]
SIGMAS = [1, .75, .5, .25, 0]


class Loop:
    """ComfyUI's dit loop: a block whose key is in patches_replace["dit"] is called through the patch."""

    def __init__(self, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.w = [torch.randn(8, 8, generator=g) * 0.3 for _ in range(N_BLOCKS)]
        self.runs = 0  # real block runs

    def __call__(self, x, topts):
        dit = ((topts or {}).get("patches_replace") or {}).get("dit") or {}
        for i, w in enumerate(self.w):
            def block(args, w=w):
                self.runs += 1
                return {"img": torch.tanh(args["img"] @ w) + args["img"]}
            args = {"img": x, "transformer_options": topts}
            x = (dit[("double_block", i)](args, {"original_block": block}) if ("double_block", i) in dit
                 else block(args))["img"]
        return x


def ours():
    return {k: make_dit_patch(s, OWNER) for k, s in zip(KEYS, SLOTS)}


def options(dit, cond=(0,)):
    return {"patches_replace": {"dit": dict(dit)}, "cond_or_uncond": list(cond), "uuids": [f"u{c}" for c in cond]}


def skip(args, extra):  # Skip Layer Guidance's patch: the block is not run
    return args


def apply_model(run, loop, x, sigma, topts, guard=True):
    """What hooks._apply_model does around the model (its ComfyUI-free part)."""
    called = topts
    if guard:
        called, patches = foreign.guard_call(topts, run.slots, OWNER, make_dit_patch)
    else:
        patches = foreign.signature(topts, OWNER)
    run.begin_call(sigma, topts, patches)
    out = loop(x, called)
    if run.end_call():
        out = loop(x, called)
    return out


def sample(run, loop, calls_per_step, steps=4):
    """calls_per_step(step) -> [(x, topts)]: every call of the step; returns their outputs, step by step."""
    token = activate(run) if run is not None else None
    outs = []
    try:
        for i in range(steps):
            step_out = []
            for x, topts in calls_per_step(i):
                step_out.append(loop(x, topts) if run is None else apply_model(run, loop, x, SIGMAS[i], topts))
            outs.append(step_out)
            if run is not None:
                run.tracker.completed(i)
    finally:
        if token is not None:
            deactivate(token)
    return outs


def inputs(i, n=1):
    g = torch.Generator().manual_seed(100 + i)
    return [torch.randn(1, 5, 8, generator=g) for _ in range(n)]


def new_run(mask):
    run = RunState(lambda: ResidualCache(mask), StepTracker(SIGMAS), OWNER)
    run.slots = SLOTS
    return run


# ------------------------------------------------------------------------------------------ guard_call
def test_guard_call_wraps_other_nodes_entries_in_a_copy_and_names_them_stably():
    dit = ours()
    topts = options({**dit, KEYS[1]: skip})
    before = {k: v for k, v in topts["patches_replace"]["dit"].items()}
    guarded, sig = foreign.guard_call(topts, SLOTS, OWNER, make_dit_patch)
    assert guarded is not topts and topts["patches_replace"]["dit"] == before  # ComfyUI's dicts untouched
    wrapped = guarded["patches_replace"]["dit"][KEYS[1]]
    assert foreign.is_ours(wrapped, OWNER) and wrapped.gcache_inner is skip
    assert all(guarded["patches_replace"]["dit"][k] is dit[k] for k in (KEYS[0], KEYS[2], KEYS[3]))
    assert sig == f"dit double_block 1: {__name__}.skip"
    again = options({**ours(), KEYS[1]: skip})  # another step: new dicts, new GCache patches, same skip
    assert foreign.guard_call(again, SLOTS, OWNER, make_dit_patch)[1] == sig
    plain = options(ours())
    assert foreign.guard_call(plain, SLOTS, OWNER, make_dit_patch) == (plain, "")


def test_guard_call_fills_a_missing_slot_and_leaves_a_call_without_gcache_alone():
    dit = ours()
    del dit[KEYS[0]]
    guarded, sig = foreign.guard_call(options(dit), SLOTS, OWNER, make_dit_patch)
    assert sig == "" and foreign.is_ours(guarded["patches_replace"]["dit"][KEYS[0]], OWNER)
    none = options({})  # no patch in any of GCache's slots (patches_replace["dit"] gone): the call computes as it is
    assert foreign.guard_call(none, SLOTS, OWNER, make_dit_patch)[0] is none
    other = options({KEYS[1]: skip})  # only another node's: gated all the same, a stack of GCache's gates
    guarded = foreign.guard_call(other, SLOTS, OWNER, make_dit_patch)[0]["patches_replace"]["dit"]
    assert all(foreign.is_ours(guarded[k], OWNER) for k in KEYS) and guarded[KEYS[1]].gcache_inner is skip


def test_chain_target_and_names():
    def other(args, extra):
        return args
    assert foreign.chain_target(None) is None and foreign.chain_target(other) is other
    assert foreign.chain_target(make_dit_patch(SLOTS[0], "x", other)) is other  # an earlier GCache's inner
    assert foreign.chain_target(make_dit_patch(SLOTS[0], "x")) is None          # an earlier GCache's own patch

    class Patch:
        def __call__(self, args, extra):
            return args

        def method(self, args, extra):
            return args
    assert foreign.name_of(Patch()) == f"{__name__}.{Patch.__qualname__}"
    assert foreign.name_of(Patch().method) == f"{__name__}.{Patch.method.__qualname__}"
    assert foreign.name_of(functools.partial(other, None)) == f"{__name__}.{other.__qualname__}"


# ------------------------------------------------------------------------------------------ per-call branches
@pytest.mark.parametrize("where", [0, 1, N_BLOCKS - 1])
def test_a_guidance_call_with_a_skipped_block_is_a_branch_of_its_own(where):
    """Each step: the plain call, then the same cond with block `where` skipped (SkipLayerGuidanceDiT). Computed
    steps: both equal the loop's own output; skipped steps: h + the true δ of that call's own last computed step."""
    mask = [1, 0, 1, 0]
    loop = Loop()

    def calls(i, dit_plain, dit_skip):
        x = inputs(i)[0]
        return [(x, options(dit_plain)), (x * 0.9, options({**dit_skip, KEYS[where]: skip}))]

    ref = sample(None, loop, lambda i: calls(i, {}, {}))
    run = new_run(mask)
    got = sample(run, loop, lambda i: calls(i, ours(), ours()))
    h = [[c[0] for c in calls(i, {}, {})] for i in range(4)]
    for i, computed in enumerate(mask):
        for j in range(2):
            want = ref[i][j] if computed else h[i][j] + (ref[i - 1][j] - h[i - 1][j])
            assert torch.allclose(got[i][j], want, atol=1e-6), (i, j)
    stats = run.close()
    assert set(stats.block_runs) == {(0, 0), Variant((0, 0), f"dit double_block {where}: {__name__}.skip")}


def test_the_same_node_order_gives_the_same_output():
    """A patch in GCache's slot before GCache (wrapped at patch time) and after it (per call) run the same blocks."""
    loop = Loop()

    def counting(n):
        def other(args, extra):
            n.append(1)
            out = extra["original_block"](args)
            return {"img": out["img"] + 0.2}
        return other
    n_before, n_after = [], []
    before = {k: make_dit_patch(s, OWNER, counting(n_before) if k == KEYS[2] else None) for k, s in zip(KEYS, SLOTS)}
    after = {**ours(), KEYS[2]: counting(n_after)}
    a = sample(new_run([1, 0, 1, 0]), loop, lambda i: [(inputs(i)[0], options(before))])
    b = sample(new_run([1, 0, 1, 0]), loop, lambda i: [(inputs(i)[0], options(after))])
    assert all(torch.equal(x[0], y[0]) for x, y in zip(a, b)) and len(n_before) == len(n_after) == 2


def test_a_patch_that_chains_to_gcaches_gets_one_gate():
    loop = Loop()
    mine = ours()
    n = []

    def chaining(args, extra, previous=mine[KEYS[1]]):
        n.append(1)
        return previous(args, extra)
    run = new_run([1, 0, 1, 0])
    got = sample(run, loop, lambda i: [(inputs(i)[0], options({**mine, KEYS[1]: chaining}))])
    ref = sample(new_run([1, 0, 1, 0]), loop, lambda i: [(inputs(i)[0], options(ours()))])
    assert all(torch.equal(x[0], y[0]) for x, y in zip(got, ref)) and len(n) == 2
    assert run.close().stack_calls == 4  # one entry per call, not two


# ------------------------------------------------------------------------------------------ the gate's robustness
def test_a_replaced_first_block_computes_the_call_without_error():
    """Not guarded (as for object patches): the call never enters the stack, so no block may skip or exit."""
    loop = Loop()
    dit = {**ours(), KEYS[0]: skip}
    run = new_run([1, 0, 1, 0])
    token = activate(run)
    try:
        outs = []
        for i in range(4):
            outs.append(apply_model(run, loop, inputs(i)[0], SIGMAS[i], options(dit), guard=False))
            run.tracker.completed(i)
    finally:
        deactivate(token)
    ref = [Loop()(inputs(i)[0], options({KEYS[0]: skip})) for i in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(outs, ref))
    assert run.close().stack_calls == 0


def test_a_replaced_last_block_on_a_skipped_step_is_computed_again(caplog):
    """Entered and skipped, but GCache's last block never came: h + δ was never put back. The call runs again,
    computing every block, and calls with the same patches compute for the rest of the run; one warning."""
    dit_last = {**ours(), KEYS[-1]: skip}
    run = new_run([1, 0, 1, 0])
    loop = Loop()
    token = activate(run)
    outs = []
    try:
        with caplog.at_level("WARNING", logger="gcache"):
            for i in range(4):
                outs.append(apply_model(run, loop, inputs(i)[0], SIGMAS[i], options(dit_last), guard=False))
                run.tracker.completed(i)
    finally:
        deactivate(token)
    ref = [Loop()(inputs(i)[0], options({KEYS[-1]: skip})) for i in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(outs, ref))
    assert caplog.text.count("did not leave it through GCache's last block") == 1
    assert run.lane().cache._pending is None and run.uncached == {f"dit double_block {N_BLOCKS - 1}: {__name__}.skip"}


def test_a_call_left_half_entered_is_dropped_by_the_next_call():
    """A caller that never returns to end_call (an exception above the model): the next call starts clean."""
    run = new_run([1, 0, 1, 0])
    loop = Loop()
    token = activate(run)
    try:
        run.begin_call(1.0, options(ours()))
        x = inputs(0)[0]
        make_dit_patch(SLOTS[0], OWNER)({"img": x}, {"original_block": lambda a: {"img": a["img"] + 1}})
        assert run.lane().entered and run.lane().cache._pending is not None
        run.tracker.completed(0)
        out = apply_model(run, loop, inputs(1)[0], SIGMAS[1], options(ours()))  # step 1 may skip: no δ yet
        assert torch.equal(out, Loop()(inputs(1)[0], None))  # computed (forced: the plain branch has no δ)
        assert not run.lane().entered and run.lane().cache._pending is None and run.uncached == set()
    finally:
        deactivate(token)


def test_a_failing_block_leaves_nothing_entered():
    run = new_run([1, 0, 1, 0])
    token = activate(run)
    try:
        run.begin_call(1.0, options(ours()))

        def boom(args):
            raise RuntimeError("out of memory")
        with pytest.raises(RuntimeError):
            make_dit_patch(SLOTS[0], OWNER)({"img": inputs(0)[0]}, {"original_block": boom})
        assert not run.lane().entered and run.lane().cache._pending is None and not run.end_call()
    finally:
        deactivate(token)


def test_a_patch_that_changes_the_image_tokens_never_fails_the_prompt(caplog):
    """Another node's patch at the last block that returns fewer tokens: the call's output stands (computed), calls
    with that patch compute from then on, one warning; the plain calls keep their cache."""
    def shorter(args, extra):
        return {"img": extra["original_block"](args)["img"][:, :-1]}
    loop = Loop()
    run = new_run([1, 0, 1, 0])
    with caplog.at_level("WARNING", logger="gcache"):
        got = sample(run, loop, lambda i: [(inputs(i)[0], options(ours())),
                                           (inputs(i)[0], options({**ours(), KEYS[-1]: shorter}))])
    ref = sample(None, Loop(), lambda i: [(inputs(i)[0], None), (inputs(i)[0], options({KEYS[-1]: shorter}))])
    assert all(torch.equal(g[1], r[1]) for g, r in zip(got, ref))  # the patched calls: as without GCache
    assert caplog.text.count("changed the block stack's image tokens") == 1 and run.disabled is None
    assert run.close().block_runs[(0, 0)] == 2  # the plain calls still skipped steps 1 and 3


# ------------------------------------------------------------------------------ what would see the self-check's replay
def _stateful_cache_wrapper(executor, *args, **kwargs):  # a third-party cache pack's APPLY_MODEL wrapper
    return executor(*args, **kwargs)


_stateful_cache_wrapper.__module__ = "teacache_pack.nodes"


def test_other_nodes_code_inside_gcaches_model_call_is_named_and_comfyuis_own_is_not():
    """Issue 47: the replay calls the rest of the APPLY_MODEL chain a second time; a third-party cache there would
    count it, or serve it from its own cache. What runs inside GCache's wrapper is named; ComfyUI's and GCache's own
    are known safe; what runs outside it (wrappers before GCache's) never sees the replay."""
    import functools
    from types import SimpleNamespace

    from gcache.nodes.patching.foreign import unknown_wrappers

    def comfy_wrapper(executor, *a, **kw):
        return executor(*a, **kw)
    comfy_wrapper.__module__ = "comfy_extras.nodes_something"
    gcache_wrapper = SimpleNamespace(gcache_owner="o", __call__=None)
    chain = SimpleNamespace(wrappers=[_stateful_cache_wrapper, gcache_wrapper, comfy_wrapper], idx=1)  # GCache's is 1
    assert unknown_wrappers(chain, {}) == []  # the third-party one runs before GCache's: it sees one call
    chain.wrappers = [gcache_wrapper, functools.partial(_stateful_cache_wrapper), comfy_wrapper]
    chain.idx = 0
    assert unknown_wrappers(chain, {}) == ["teacache_pack.nodes._stateful_cache_wrapper"]
    topts = {"wrappers": {"diffusion_model": {"teacache": [_stateful_cache_wrapper]}, "outer_sample": {"x": [len]}}}
    assert unknown_wrappers(SimpleNamespace(), topts) == ["teacache_pack.nodes._stateful_cache_wrapper"]

    class Model(torch.nn.Module):
        def forward_orig(self, x):
            return x
    dm = Model()
    dm.helper = len  # an attribute that patches no method of the class
    assert unknown_wrappers(None, None, dm) == []
    dm.forward_orig = _stateful_cache_wrapper  # ModelPatcher's object patch of a cache pack
    assert unknown_wrappers(None, None, dm) == ["teacache_pack.nodes._stateful_cache_wrapper"]
