"""Messages that tell the truth, inside real ComfyUI: every "saved X" is logged once X exists, every message names the
real cause and the action really taken, damaged or foreign files stop a node before any sampling, a gcache folder
that can't be written is said once, at every node that writes there, and a foreground search is listed as running."""
import json
import logging
import os
import re
import subprocess

import pytest
from conftest import COMFY, REASON

if not COMFY:
    pytest.skip(REASON, allow_module_level=True)

import numpy as np  # noqa: E402
import tiny_models as tm  # noqa: E402
import torch  # noqa: E402

import nodes as comfy_nodes  # noqa: E402
from gcache.core.errors import GCacheError  # noqa: E402
from gcache.core.policy import Policy  # noqa: E402
from gcache.core.profile import Profile  # noqa: E402
from gcache.nodes import artifacts  # noqa: E402
from gcache.nodes.apply_node import GCacheApply  # noqa: E402
from gcache.nodes.policy_node import GCachePolicy  # noqa: E402
from gcache.nodes.profile_node import GCacheProfile  # noqa: E402
from gcache.nodes.search_jobs import background  # noqa: E402
from gcache.nodes.search_jobs import job as search_job
from gcache.nodes.search_node import GCacheSearch  # noqa: E402

N = 6


@pytest.fixture(scope="module")
def flux():
    return tm.flux()


def ksample(model, pos, neg, lat, steps=N, cfg=1.0):
    return comfy_nodes.common_ksampler(model, 0, steps, cfg, "euler", "simple", pos, neg,
                                       {"samples": lat})[0]["samples"]




class SavedFilesExist(logging.Handler):
    """Checks, as each gcache log record is made, that every file it calls saved ("saved X", "saved as X", "the
    saved X") is in the folder at that moment."""
    SAVED = re.compile(r"(?<!not )\bsaved (?:as )?([\w.\-]+\.(?:json|safetensors))")

    def __init__(self, folder):
        super().__init__(logging.DEBUG)
        self.folder, self.claims, self.missing = folder, [], []

    def emit(self, record):
        for name in self.SAVED.findall(record.getMessage()):
            self.claims.append(name)
            if not (self.folder / name).is_file():
                self.missing.append((name, record.getMessage()))


@pytest.fixture()
def saved_files_exist(gcache_dir):
    h = SavedFilesExist(gcache_dir)
    logger = logging.getLogger("gcache")
    logger.addHandler(h)
    old = logger.level
    logger.setLevel(logging.DEBUG)
    yield h
    logger.removeHandler(h)
    logger.setLevel(old)
    assert not h.missing, h.missing


@pytest.fixture()
def read_only(gcache_dir):
    """Makes the gcache folder one nothing can be written in, for real: immutable for root (whom file modes don't
    stop), read-only by mode for a user. Returns a function that does it (files can be put there first)."""
    state = {}

    def lock():
        if getattr(os, "geteuid", lambda: -1)() == 0:
            try:
                r = subprocess.run(["chattr", "+i", str(gcache_dir)], capture_output=True, text=True)
            except OSError as e:
                r = subprocess.CompletedProcess([], 1, "", str(e))
            if r.returncode != 0:
                pytest.skip(f"chattr +i is not allowed here ({r.stderr.strip()}): no read-only folder for root")
            state["chattr"] = True
        else:
            os.chmod(gcache_dir, 0o555)
            state["chmod"] = True
        try:  # checked by hand, not by the code under test
            open(gcache_dir / "probe", "x").close()
        except OSError:
            return
        os.unlink(gcache_dir / "probe")
        pytest.skip("a folder read-only by mode is still writable here (Windows?)")
    yield lock
    if state.get("chattr"):
        subprocess.run(["chattr", "-i", str(gcache_dir)], check=True)
    if state.get("chmod"):
        os.chmod(gcache_dir, 0o755)


def gcache_records(caplog, level=logging.WARNING):
    return [r.getMessage() for r in caplog.records if r.name == "gcache" and r.levelno >= level]


def search_args(flux, name, k=3, budget=12, steps=N):
    from gcache_test_pack import FakeVAE
    m, pos, neg, lat = flux
    return (m, pos, neg, {"samples": lat}, FakeVAE(), 0, 1, steps, 1.0, "euler", "simple", k, budget, 2, "ssim", name)


def no_sampling(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("sampled")
    monkeypatch.setattr(search_job, "sample", refuse)


# ------------------------------------------------------------------------------ "saved" means saved
def test_every_saved_file_exists_when_the_log_says_so(flux, gcache_dir, saved_files_exist, caplog):
    m, pos, neg, lat = flux
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0]
    with caplog.at_level("INFO", logger="gcache"):
        ksample(model, pos, neg, lat)  # profiles, then saves the policy
        ksample(model, pos, neg, lat)
        ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 1.5).result[0], pos, neg, lat)
        prof = Profile.load(str(next(gcache_dir.glob("auto_*.profile.safetensors"))))
        GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", "mine")
        GCacheSearch.execute(*search_args(flux, "s_saved"))
    claims = saved_files_exist.claims
    assert any(c.endswith("_2x.json") for c in claims) and "mine.json" in claims
    assert any(c.endswith(".profile.safetensors") for c in claims)  # "built … from the saved <profile>"
    assert "GCache Policy: saved mine.json" in caplog.text  # a file name, not the server's path
    assert str(gcache_dir) not in caplog.text


def test_auto_with_the_forecast_input_never_claims_a_policy_file_it_does_not_write(flux, gcache_dir,
                                                                                  saved_files_exist, caplog):
    """With the forecast input set, run 1 once logged "saved …/auto_Flux-…_2x.json …; the next run applies it.": that
    policy is built for the forecast input and never saved."""
    m, pos, neg, lat = flux
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0, "linear (1)").result[0]
    with caplog.at_level("INFO", logger="gcache"):
        ksample(model, pos, neg, lat)
    names = sorted(p.name for p in gcache_dir.iterdir() if not p.name.startswith(".") and p.name != "selfcheck.json")
    assert len(names) == 1 and names[0].endswith("_6steps_simple.profile.safetensors"), names  # no policy file
    pol_name = names[0].replace(".profile.safetensors", "_2x.json")
    assert f"saved {pol_name}" not in caplog.text and "the next run applies it" not in caplog.text
    assert "built the policy for the forecast input (linear; K = " in caplog.text
    assert f"not saved as {pol_name}; the next run builds it again from the saved {names[0]}." in caplog.text
    caplog_run1 = caplog.text
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        ksample(model, pos, neg, lat)
    # run 2 says what run 1 said, in the same words (it once read "built for the forecast input (linear), not saved,
    # auto_…_2x.json from the saved …")
    said = re.search(r"built the policy for the forecast input \(linear; K = (\d+) of 6\) from the saved (\S+), not "
                     r"saved as (\S+)$", caplog.text, re.M)
    assert said and said.group(2) == names[0] and said.group(3) == pol_name, caplog.text
    assert "not saved, auto_" not in caplog.text
    first = re.search(r"built the policy for the forecast input \(linear; K = (\d+) of 6, ", caplog_run1)
    assert first and first.group(1) == said.group(1)  # the K run 1 said, and this run's own line: the K it ran
    assert f"GCache: computed {said.group(1)}/6 steps" in caplog.text
    assert runs.n < N
    # auto's own policy, and no profile to build one for the forecast input from: that policy, said so
    ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat)
    (gcache_dir / names[0]).unlink()
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        ksample(model, pos, neg, lat)
    assert f"applying {pol_name} with the forecast input (linear): {names[0]} is missing, so no policy can be " \
        "built for it" in caplog.text
    assert runs.n == Policy.load(str(gcache_dir / pol_name)).n_computed


# ------------------------------------------------------------------------------ a folder that can't be written
def test_search_in_a_read_only_folder_says_so_before_sampling(flux, gcache_dir, read_only, monkeypatch):
    """It once said "The reference runs recorded no profile (was sampling interrupted?)" after sampling them."""
    read_only()
    no_sampling(monkeypatch)
    with pytest.raises(GCacheError) as e:
        GCacheSearch.execute(*search_args(flux, "s_ro"))
    msg = str(e.value)
    # the folder by its name, never the server's absolute path (the message reaches the browser)
    assert f"GCache Search can't keep its state file and policy: the gcache folder {gcache_dir.name} can't be " \
        "written (" in msg and "Nothing was sampled" in msg and "extra_model_paths.yaml" in msg
    assert "interrupted" not in msg and str(gcache_dir) not in msg
    assert not os.listdir(gcache_dir)


def test_search_names_why_its_reference_runs_left_no_profile(flux, gcache_dir, monkeypatch, caplog):
    """A run not added to the search's profile (here: a full disk while merging) is named, not guessed at."""
    def full_disk(path, run, lock_timeout_s=120.0):
        raise OSError(28, "No space left on device", path)
    monkeypatch.setattr(artifacts, "merge_into_file", full_disk)
    with pytest.raises(GCacheError) as e:
        GCacheSearch.execute(*search_args(flux, "s_full"))
    msg = str(e.value)
    assert msg.startswith("The reference runs recorded no profile (s_full.search.profile.safetensors): could not add "
                          "the run to s_full.search.profile.safetensors (No space left on device).")
    assert "interrupted" not in msg and str(gcache_dir) not in msg


def test_policy_node_in_a_read_only_folder_says_so_and_what_to_do(flux, gcache_dir, read_only, caplog):
    """It once raised a raw PermissionError naming a temporary file."""
    m, pos, neg, lat = flux
    ksample(GCacheProfile.execute(m, "p", "model device").result[0], pos, neg, lat)
    prof = Profile.load(str(gcache_dir / "p.profile.safetensors"))
    read_only()
    with pytest.raises(GCacheError) as e:
        GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", "mine")
    msg = str(e.value)
    assert msg.startswith(f"GCache Policy can't save mine.json: the gcache folder {gcache_dir.name} can't be written (")
    assert "; or empty save_name to use the policy without saving it" in msg and ".tmp-" not in msg
    assert str(gcache_dir) not in msg
    pol = GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", "").result[0]  # not saved: works
    assert pol.n_computed == 3


def test_profile_node_in_a_read_only_folder_stops_before_sampling(flux, gcache_dir, read_only):
    read_only()
    with pytest.raises(GCacheError) as e:
        GCacheProfile.execute(flux[0], "p", "model device")
    msg = str(e.value)
    assert msg.startswith(f"GCache Profile can't add runs to p.profile.safetensors: the gcache folder "
                          f"{gcache_dir.name} can't be written (") and "Nothing was sampled" in msg
    assert str(gcache_dir) not in msg
    assert "take GCache Profile out of the workflow to sample without profiling" in msg


def test_apply_auto_in_a_read_only_folder_says_so_once_and_keeps_the_image(flux, gcache_dir, read_only, caplog):
    m, pos, neg, lat = flux
    model = GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0]
    read_only()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        out = ksample(model, pos, neg, lat)
    assert torch.equal(out, ksample(m, pos, neg, lat)) and runs.n == N
    said = gcache_records(caplog)
    assert len(said) == 1, said  # one message, before sampling
    assert f"the gcache folder {gcache_dir} can't be written (" in said[0]
    assert "this run computes every step without profiling (nothing could be saved)" in said[0]
    assert "extra_model_paths.yaml" in said[0] and not os.listdir(gcache_dir)


def test_apply_auto_builds_from_a_saved_profile_in_a_read_only_folder_and_says_it_is_not_saved(flux, gcache_dir,
                                                                                              read_only, caplog):
    m, pos, neg, lat = flux
    ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat)
    read_only()
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 1.5).result[0], pos, neg, lat)
    built = [r for r in gcache_records(caplog, logging.INFO) if "from the saved" in r]
    assert len(built) == 1 and "_1.5x.json (not saved: the gcache folder " in built[0] and runs.n < N
    assert not any(p.name.endswith("_1.5x.json") for p in gcache_dir.iterdir())


# ------------------------------------------------------------------------------ damaged and foreign files
def test_a_damaged_or_foreign_state_file_stops_the_search_before_sampling(flux, gcache_dir, monkeypatch):
    """A damaged state was once found after the reference runs, with a new profile written first."""
    (gcache_dir / "s_bad.search.json").write_text("{ not json")
    real_sample = search_job.sample
    no_sampling(monkeypatch)
    with pytest.raises(GCacheError, match=r"The search state s_bad.search.json is unreadable or damaged"):
        GCacheSearch.execute(*search_args(flux, "s_bad"))
    assert sorted(os.listdir(gcache_dir)) == ["s_bad.search.json"]  # no profile written
    # a state file of another search (another K): refused before sampling, naming only what differs
    monkeypatch.setattr(search_job, "sample", real_sample)
    GCacheSearch.execute(*search_args(flux, "s_k3", k=3))
    no_sampling(monkeypatch)
    before = (gcache_dir / "s_k3.search.json").read_bytes()
    with pytest.raises(GCacheError, match=r"s_k3.search.json belongs to another search \(k: file 3, now 4\)\. "):
        GCacheSearch.execute(*search_args(flux, "s_k3", k=4))
    assert (gcache_dir / "s_k3.search.json").read_bytes() == before


def test_a_background_slice_that_finds_a_damaged_state_file_ends_the_search_in_the_tab(flux, gcache_dir,
                                                                                       monkeypatch):
    """The check before sampling runs in every slice too: the tab then says why the search ended."""
    from types import SimpleNamespace
    state = gcache_dir / "s_slice.search.json"
    state.write_text("{ not json")  # damaged between two slices
    bg = background.JOBS.put(background.Job("s_slice", str(state), 12, "6", {}, status="queued"))
    monkeypatch.setattr(GCacheSearch, "hidden", SimpleNamespace(
        prompt={"6": {"inputs": {background.SLICE_KEY: bg.marker}}}, unique_id="6"), raising=False)
    no_sampling(monkeypatch)
    with pytest.raises(GCacheError, match="s_slice.search.json is unreadable or damaged"):
        GCacheSearch.execute(*search_args(flux, "s_slice"))
    row = next(r for r in background.JOBS.listing([str(gcache_dir)]) if r["id"] == "s_slice")
    assert row["status"] == "failed" and "s_slice.search.json is unreadable or damaged" in row["message"]


def test_a_damaged_auto_profile_is_followed_by_what_the_run_really_does(flux, gcache_dir, caplog):
    """A truncated 12-step auto profile once logged "moved … and is made again" while the run remapped the 6-step
    policy and wrote no new profile."""
    m, pos, neg, lat = flux
    ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat)
    ksample(GCacheApply.execute(m, "(auto)", "model device", "error", 2.0).result[0], pos, neg, lat, steps=12)
    pol12 = next(gcache_dir.glob("auto_*_12steps_simple_2x.json"))
    prof12 = next(gcache_dir.glob("auto_*_12steps_simple.profile.safetensors"))
    pol6 = next(gcache_dir.glob("auto_*_6steps_simple_2x.json"))
    pol12.unlink()
    prof12.write_bytes(prof12.read_bytes()[:100])
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"), tm.BlockRuns(m) as runs:
        ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat, steps=12)
    side = prof12.name.replace(".profile.safetensors", ".damaged-1.profile.safetensors")
    said = gcache_records(caplog)
    assert len(said) == 1 and said[0].startswith(f"GCache Apply auto: {prof12.name} can't be read (")
    assert said[0].endswith(f"it was moved to {side}; remapping {pol6.name} to 12 steps"), said[0]
    assert "made again" not in caplog.text and not prof12.exists() and (gcache_dir / side).is_file()
    assert runs.n == 2 * Policy.load(str(pol6)).n_computed  # the remapped policy, not a profiling run


def test_auto_says_when_the_few_steps_rule_overrides_the_bound(flux, gcache_dir, caplog):
    """At 8 steps auto forecasts with reuse even where its held-out bound favours another forecaster; the log once
    showed the bounds (fitted lowest) and 'forecast reuse' without saying why."""
    from gcache.search.instant import forecaster_scores
    m, pos, neg, lat = flux
    ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.5).result[0], pos, neg, lat, steps=8, cfg=3.0)
    prof_path = next(gcache_dir.glob("auto_*_8steps_simple.profile.safetensors"))
    prof = Profile.load(str(prof_path))
    # io share 0.25: K = 2 at 2.5x (2.29x ≤ 2.5 < 2.91x)
    prof.meta["io_runs"] = [{"median": 0.25, "q1": 0.25, "q3": 0.25, "steps": 6}]
    prof.save(str(prof_path))
    next(gcache_dir.glob("auto_*_8steps_simple_2.5x.json")).unlink()
    scores = forecaster_scores(prof, 2)
    assert scores["fitted"] < scores["reuse"]  # this profile's bound favours fitted at K = 2
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"):
        ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.5).result[0], pos, neg, lat, steps=8,
                cfg=3.0)
    assert "GCache Apply auto: forecast reuse for K = 2 (held-out bounds: " in caplog.text
    assert "; the bound favours fitted, but at 8 steps or fewer auto forecasts with reuse: there the bound ranks " \
        "forecasters wrongly" in caplog.text
    pol = Policy.load(str(next(gcache_dir.glob("auto_*_8steps_simple_2.5x.json"))))
    assert pol.forecast == "reuse" and pol.n_computed == 2
    assert pol.provenance["auto"]["forecaster"] == "reuse at 8 steps or fewer"


# ------------------------------------------------------------------------------ the foreground search in the tab
def test_a_foreground_search_is_listed_as_running_and_cancel_stops_it_with_the_best_policy_so_far(flux, gcache_dir,
                                                                                                  monkeypatch):
    """The tab once listed a running foreground search as "not running in this ComfyUI: queue … again"."""
    seen = {}
    real_sample, calls = search_job.sample, [0]

    def sample(*a, **k):
        calls[0] += 1
        if calls[0] == 5:  # the reference run and 3 evaluations done: the user presses Cancel in the tab
            seen["row"] = next(r for r in background.JOBS.listing([str(gcache_dir)]) if r["id"] == "s_fg")
            assert background.JOBS.cancel("s_fg").status == "cancelled"
        return real_sample(*a, **k)
    monkeypatch.setattr(search_job, "sample", sample)
    policy, image = GCacheSearch.execute(*search_args(flux, "s_fg", k=4, budget=12, steps=12)).result
    row = seen["row"]
    assert row["status"] == "running" and row["mode"] == "foreground" and row["evaluations"] >= 3
    assert row["message"] == "running in the foreground (this prompt): evaluating"
    state = json.loads((gcache_dir / "s_fg.search.json").read_text())
    n = len(state["history"])
    assert not state["done"] and n == row["evaluations"] + 1  # the evaluation in progress finished, then it stopped
    best = min(state["history"], key=lambda h: (h["loss"], h["i"]))
    assert policy.mask == [int(c) for c in best["mask"]] and image.shape[-1] == 3
    row = next(r for r in background.JOBS.listing([str(gcache_dir)]) if r["id"] == "s_fg")
    assert row["status"] == "cancelled" and row["message"].startswith(f"cancelled after {n} of 12 evaluations; the "
                                                                      "prompt went on with the best policy so far")
    assert not (gcache_dir / "s_fg.json").exists()
    # queued again, it resumes and finishes: listed as done
    monkeypatch.setattr(search_job, "sample", real_sample)
    policy = GCacheSearch.execute(*search_args(flux, "s_fg", k=4, budget=12, steps=12)).result[0]
    row = next(r for r in background.JOBS.listing([str(gcache_dir)]) if r["id"] == "s_fg")
    assert row["status"] == "done" and row["evaluations"] == 12 and row["message"] == "done: s_fg.json saved"
    assert Policy.load(str(gcache_dir / "s_fg.json")).mask == policy.mask


# ------------------------------------------------------------------------------ what an error shows the browser
def test_errors_cut_long_names_and_name_no_server_path(flux, gcache_dir, monkeypatch):
    """ComfyUI sends a node's error message to the browser: a 5000-character name was echoed in full, and errors
    named files by their absolute server paths."""
    import folder_paths
    m, pos, neg, lat = flux
    long = "n" * 5000
    ksample(GCacheProfile.execute(m, "p", "model device").result[0], pos, neg, lat)
    prof = Profile.load(str(gcache_dir / "p.profile.safetensors"))
    calls = {"Search policy_name": lambda: GCacheSearch.execute(*search_args(flux, long)),
             "Profile profile_name": lambda: GCacheProfile.execute(m, long, "model device"),
             "Policy save_name": lambda: GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", long),
             "Policy bernstein_s": lambda: GCachePolicy.execute(prof, "K", 2.0, 3, "bernstein", long, ""),
             "Apply policy_file": lambda: GCacheApply.execute(m, long + ".json", "model device", "remap"),
             "Apply cache_device": lambda: GCacheApply.execute(m, "(auto)", long, "remap"),
             "Search objective": lambda: GCacheSearch.execute(*search_args(flux, "s")[:14], long, "s")}
    for what, call in calls.items():
        with pytest.raises(GCacheError) as e:
            call()
        msg = str(e.value)
        assert "n" * 78 + "…" in msg and "n" * 80 not in msg and len(msg) < 600, (what, msg)
    # a file named by its absolute path, in a GCacheError or an OSError: by its name in the gcache folder
    Policy([1, 0, 1, 0, 1, 0]).save(str(gcache_dir / "mine.json"))
    folder_paths.filename_list_cache.clear()
    for raised in (GCacheError(f"No policy file at {gcache_dir / 'mine.json'}."),
                   PermissionError(13, "Permission denied", str(gcache_dir / ".tmp-x1"))):
        def read(path, raised=raised):
            raise raised
        monkeypatch.setattr(artifacts, "read_policy", read)
        with pytest.raises(type(raised)) as e:
            GCacheApply.execute(m, "mine.json", "model device", "remap")
        assert str(gcache_dir) not in str(e.value), str(e.value)
        assert str(e.value) in ("No policy file at mine.json.", "[Errno 13] Permission denied: '.tmp-x1'")


def test_the_missing_packages_message_names_this_packs_requirements_under_comfyuis_folder(monkeypatch):
    """The browser's copy of "install GCache's requirements" once said `pip install -r requirements.txt` (the path cut
    to its last part with the server's paths): it names the pack's file as a user in ComfyUI's folder types it."""
    import folder_paths

    from gcache.nodes import comfy_common as cc
    from gcache.search.infra import requirements
    pack = os.path.dirname(requirements.REQUIREMENTS)
    assert os.path.isfile(os.path.join(pack, "__init__.py")) and pack == cc.PACK_DIR
    monkeypatch.setitem(requirements.PIP_NAMES, "gcache_no_such_module", "no-such-package")
    with pytest.raises(GCacheError) as e:
        requirements.require("gcache_no_such_module")
    assert requirements.REQUIREMENTS in str(e.value)  # the server's own text (its log) has the full path
    parent, name = os.path.split(pack)
    for base, shown in ((os.path.dirname(parent), f"{os.path.basename(parent)}/{name}/requirements.txt"),
                        (os.path.join(os.sep, "elsewhere", "comfy"), f"custom_nodes/{name}/requirements.txt")):
        monkeypatch.setattr(folder_paths, "base_path", base)
        msg = cc.for_the_browser(str(e.value))
        assert f"pip install -r {shown}\n" in msg and pack not in msg and "no-such-package" in msg, (base, msg)


# ------------------------------------------------------------------------------ log lines that agree
def test_a_remapped_fitted_policy_says_one_thing_about_its_forecast(flux, gcache_dir, caplog):
    """A fitted policy applied at another step count once logged "its skipped steps forecast linearly" and then, in
    the run's summary, "forecast fitted"."""
    import folder_paths
    m, pos, neg, lat = flux
    ksample(GCacheProfile.execute(m, "pf", "model device", True).result[0], pos, neg, lat)
    prof = Profile.load(str(gcache_dir / "pf.profile.safetensors"))
    GCachePolicy.execute(prof, "K", 2.0, 3, "theory", "", "fit", "fitted (profile)")
    saved = Policy.load(str(gcache_dir / "fit.json"))
    assert saved.forecast == "fitted"
    folder_paths.filename_list_cache.clear()
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"):
        ksample(GCacheApply.execute(m, "fit.json", "model device", "remap").result[0], pos, neg, lat)
    own = [r for r in gcache_records(caplog, logging.INFO) if r.startswith("GCache: computed")]
    assert len(own) == 1 and own[0].endswith("; forecast fitted, 2 residuals kept per branch]"), own
    assert not gcache_records(caplog)  # its own step count: nothing to warn about
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"):
        ksample(GCacheApply.execute(m, "fit.json", "model device", "remap").result[0], pos, neg, lat, steps=12)
    warned, = gcache_records(caplog)
    line, = [r for r in gcache_records(caplog, logging.INFO) if r.startswith("GCache: computed")]
    how = "linearly from the last 2 computed steps"
    assert warned == f"GCache: forecast fitted has no parameters for this run's mask (its mask was remapped): its " \
        f"skipped steps forecast {how}. For fitted itself, make the policy with it (GCache Policy or Search)."
    assert line.endswith(f"; forecast fitted without its parameters (its mask was remapped): {how}, 2 residuals kept "
                         "per branch]"), line
    assert line.startswith(f"GCache: computed {saved.remap(12).n_computed}/12 steps")


def test_auto_says_what_it_saved_and_applies_as_the_files_hold_it(flux, gcache_dir, caplog):
    m, pos, neg, lat = flux
    with caplog.at_level("INFO", logger="gcache"):
        ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat)
    saved = re.search(r"GCache Apply auto: saved (\S+) \(K = (\d+) of (\d+), forecast (\w+), predicted", caplog.text)
    pol = Policy.load(str(gcache_dir / saved.group(1)))
    assert (pol.n_computed, pol.n_steps, pol.forecast) == (int(saved.group(2)), int(saved.group(3)), saved.group(4))
    caplog.clear()
    with caplog.at_level("INFO", logger="gcache"):
        ksample(GCacheApply.execute(m, "(auto)", "model device", "remap", 2.0).result[0], pos, neg, lat)
    assert f"GCache Apply auto: applying {saved.group(1)} (forecast {pol.forecast})" in caplog.text
    assert f"GCache: computed {pol.n_computed}/{pol.n_steps} steps" in caplog.text
    if pol.forecast != "reuse":
        assert f"forecast {pol.forecast}, " in caplog.text and "without its parameters" not in caplog.text


# ------------------------------------------------------------------------------ numbers in tooltips
def test_the_tooltips_numbers_come_from_the_code():
    """The Profile tooltip once said "forecast 1 or 2" and "N³ numbers"; GCache Search's execute defaulted mode to
    foreground where the widget says background, unexplained."""
    import inspect

    from gcache.core import forecasters, profile_stats
    from gcache.nodes import profile_node, search_node
    tips = {i.id: i.tooltip for i in GCacheProfile.define_schema().inputs}
    # what record_forecast adds, counted from the profile's own arrays: 3·N³ and a lower order term
    for n in (10, 30, 50):
        numbers = sum(int(np.prod(t.shape(n))) for stat in profile_stats.registered() for t in stat.tensors.values())
        assert 3 * n ** 3 <= numbers <= 3 * n ** 3 + 4 * n ** 2
    assert f"about {profile_node.FORECAST_NUMBERS} numbers for N steps" in tips["record_forecast"] and \
        profile_node.FORECAST_NUMBERS == "3·N³"
    forecasting = [forecasters.get(n).label for n in forecasters.names() if forecasters.get(n).forecasts]
    assert f"need it for forecast {', '.join(forecasting[:-1])} or {forecasting[-1]}." in tips["record_forecast"]
    assert "1 or 2" not in tips["record_forecast"]
    apply_tip = {i.id: i.tooltip for i in GCacheApply.define_schema().inputs}["forecast"]
    keeps = {n: forecasters.get(n).keeps for n in ("linear", "quadratic", "l2p")}
    assert f"from the last {keeps['linear']} (linear) or {keeps['quadratic']} (quadratic) computed steps" in apply_tip
    assert f"over the last {keeps['l2p']} (l2p)" in apply_tip
    policy_tip = {i.id: i.tooltip for i in GCachePolicy.define_schema().inputs}["forecast"]
    assert f"over the last {keeps['l2p']} residuals (l2p)" in policy_tip
    # Search: the widget's default is background, a prompt without the input runs in the foreground, said in both
    mode = next(i for i in GCacheSearch.define_schema().inputs if i.id == "mode")
    assert mode.default == "background" and search_node.MODE_WITHOUT_INPUT == "foreground"
    assert inspect.signature(GCacheSearch.execute).parameters["mode"].default == "foreground"
    assert "API prompts without this input run in the foreground" in mode.tooltip
