"""The figures in README.md and docs/ are the renderings of stored bench results, and those results describe today's
code (bench/store.py, bench/render_docs.py, bench/runs.py).

- Every doc equals its rendering: a figure typed over, or a result stored without rendering, fails with the command
  that regenerates the docs.
- Every registered run has a stored result made by its command, at a commit, with measured (not typed) figures.
  A result whose code changed since is not a failure: the docs render its figures as stale (the commit they were
  measured at, "changed since"), so a fix never waits for a rerun of the benches.
- The checks can fail: a changed source is found, a docstring or comment is not; a typed figure is rewritten; a
  stale figure carries its note and a fresh one none.
"""
from __future__ import annotations

import json
import os
import re

import pytest

from gcache.bench import render_docs, runs, store


def test_the_docs_are_the_renderings_of_the_stored_results():
    try:
        changed = render_docs.render_all(write=False)
    except render_docs.RenderError as e:
        pytest.fail(str(e))
    assert not changed, (f"{', '.join(os.path.relpath(p, store.REPO) for p in changed)} differ from the stored "
                         "results' rendering: run .venv/bin/python -m gcache.bench.render_docs")


def test_every_marker_names_a_value_or_a_block():
    import re
    for path in render_docs.doc_files():
        text = open(path, encoding="utf-8").read()
        opened, closed = text.count("<!--gc:"), text.count("<!--/gc-->")
        assert opened == closed == len(render_docs.MARKER.findall(text)), f"{path}: unbalanced figure markers"
        for name in re.findall(r"<!--gc:([^>]*?)-->", text):
            assert "/" in name or name.startswith("cmd.") or name in blocks() or name == render_docs.STALE_NOTES, \
                f"{path}: unknown block {name}"


def blocks():
    from gcache.bench import render_blocks  # noqa: F401
    return render_docs.BLOCKS


@pytest.mark.parametrize("name", sorted(runs.RUNS))
def test_the_stored_result_was_measured_by_its_command_at_a_commit(name):
    run = runs.RUNS[name]
    path = store.result_path(name)
    assert os.path.exists(path), f"no stored result for {name}: run .venv/bin/python -m gcache.bench.runs {name}"
    record = store.load(name)
    rerun = f"rerun `{run.command()}` (stored by .venv/bin/python -m gcache.bench.runs {name}" + (
        f", on the machine it needs: {runs.NEEDS[run.needs]})" if run.needs else ")")
    assert record["command"] == run.command(), f"{name}: stored from `{record['command']}`; {rerun}"
    commit = record.get("git_commit")
    assert re.fullmatch(r"[0-9a-f]{40}", str(commit)), f"{name}: no commit it was measured at ({commit!r}); {rerun}"
    assert not record.get("transcribed"), f"{name}: its figures were typed, not measured; {rerun}"
    assert record.get("sources") == list(run.sources), f"{name} declares other sources now; {rerun}"
    if run.needs == "gpu" and store.staleness(record, run.sources) is not None:
        # the GPU check's own sentence names its commit and says the code changed since
        from gcache.bench import render_blocks
        when = render_blocks.gpu_check_when(render_docs.Results())
        assert str(commit)[:7] in when and "changed since" in when, when


def test_a_stale_figure_is_rendered_as_stale_and_a_fresh_one_is_not(monkeypatch, tmp_path):
    """The negative control of the rule above: a result whose code changed renders with its commit and 'changed
    since' under every figure that reads it; the same result, fresh, renders bare; a page with no stale figure has no
    notes, and rendering is idempotent either way."""
    (tmp_path / "m.py").write_text("x = 1\n")
    total, per_file = store.sources_hash(["m.py"], root=str(tmp_path))
    record = {"date": "2026-01-02 03:04", "git_commit": "abcdef1234567890", "command": "cmd-x", "sources": ["m.py"],
              "sources_hash": total, "source_files": per_file, "result": {"v": 1.5, "rows": [{"a": 1}]}}
    monkeypatch.setitem(runs.RUNS, "x", runs.Run("x", "gcache.bench.x", sources=("m.py",)))
    monkeypatch.setattr(store, "REPO", str(tmp_path))
    text = "V <!--gc:x/v|.1f-->0<!--/gc--> on <!--gc:x/@date--><!--/gc-->.\n\n<!--gc:cmd.x-->\n<!--/gc-->\n"

    def render():
        results = render_docs.Results()
        results.cache["x"] = record
        return render_docs.render_text(text, results)
    fresh = render()
    assert "V <!--gc:x/v|.1f-->1.5<!--/gc-->" in fresh and "stale" not in fresh
    (tmp_path / "m.py").write_text("x = 2\n")
    stale = render()
    assert "<!--gc:x/v|.1f-->1.5[^stale-x]<!--/gc-->" in stale and "2026-01-02[^stale-x]" in stale
    assert "```bash\ncmd-x\n```\n<!--/gc-->" in stale  # a command is no figure
    notes = stale[stale.index("<!--gc:stale.notes-->"):]
    assert "[^stale-x]: Run x, measured on 2026-01-02 at commit abcdef1" in notes and "changed since" in notes
    results = render_docs.Results()
    results.cache["x"] = record
    assert render_docs.render_text(stale, results) == stale  # idempotent
    (tmp_path / "m.py").write_text("x = 1\n")
    results = render_docs.Results()
    results.cache["x"] = record
    assert render_docs.render_text(stale, results) == fresh  # fresh again: the notes go


def test_a_stale_table_gets_its_note_under_it():
    body = render_docs.with_stale_refs("\n| a |\n|---|\n| 1 |\n", ["quality_64"])
    assert body.endswith("\n\n*Code changed since these figures were measured[^stale-quality-64].*\n")
    assert render_docs.with_stale_refs("1.5", []) == "1.5"


def test_every_stored_result_is_a_registered_run():
    """A file bench/store.py wrote belongs to a run of bench/runs.py (other JSON there, a bench's own output, may
    stay unregistered until a doc quotes it)."""
    names = set()
    for f in os.listdir(store.RESULTS_DIR):
        if f.endswith(".json"):
            with open(os.path.join(store.RESULTS_DIR, f), encoding="utf-8") as fh:
                if "sources_hash" in json.load(fh):
                    names.add(f[:-5])
    assert names <= set(runs.RUNS), f"bench/results holds {sorted(names - set(runs.RUNS))}: no run in bench/runs.py"


def test_the_hash_follows_code_not_prose(tmp_path):
    (tmp_path / "pkg").mkdir()
    mod = tmp_path / "pkg" / "m.py"
    mod.write_text('"""Doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1  # one\n')
    (tmp_path / "pkg" / "w.safetensors").write_bytes(b"\x00\x01")
    first, files = store.sources_hash(["pkg"], root=str(tmp_path))
    assert sorted(files) == ["pkg/m.py", "pkg/w.safetensors"]
    mod.write_text('"""Another doc."""\n\ndef f(x):\n    """Other."""\n    return x + 1  # two\n')
    assert store.sources_hash(["pkg"], root=str(tmp_path))[0] == first
    mod.write_text('"""Doc."""\n\ndef f(x):\n    return x + 2\n')
    assert store.sources_hash(["pkg"], root=str(tmp_path))[0] != first
    with pytest.raises(FileNotFoundError):
        store.sources_hash(["pkg", "gone.py"], root=str(tmp_path))


def test_staleness_names_what_changed(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    root = str(tmp_path)
    total, per_file = store.sources_hash(["a.py"], root=root)
    record = {"sources": ["a.py"], "sources_hash": total, "source_files": per_file}
    assert store.staleness(record, ["a.py"], root) is None
    (tmp_path / "a.py").write_text("x = 2\n")
    assert "a.py" in store.staleness(record, ["a.py"], root)
    assert "declares" in store.staleness(record, ["a.py", "b.py"], root)
    assert "typed" in store.staleness(dict(record, transcribed="by hand"), ["a.py"], root)


def test_a_typed_figure_is_rewritten_and_a_missing_result_named(monkeypatch, tmp_path):
    results = render_docs.Results()
    results.cache["x"] = {"date": "2026-01-02 03:04", "command": ".venv/bin/python -m gcache.bench.x",
                          "result": {"rows": [{"N": 4, "v": -1.234}, {"N": 8, "v": 2.0}], "d": {"a": 1.5, "b": -2}}}
    text = ("PSNR <!--gc:x/rows[N=4].v|.2f-->9.99<!--/gc--> dB on <!--gc:x/@date--><!--/gc-->, "
            "<!--gc:x/d|+.1f--><!--/gc-->\n<!--gc:cmd.x-->\n<!--/gc-->\n")
    out = render_docs.render_text(text, results)
    assert "PSNR <!--gc:x/rows[N=4].v|.2f-->−1.23<!--/gc--> dB" in out
    assert "<!--gc:x/@date-->2026-01-02<!--/gc-->" in out and "+1.5 / −2.0" in out
    assert "```bash\n.venv/bin/python -m gcache.bench.x\n```" in out
    assert render_docs.render_text(out, results) == out  # rendering is idempotent
    with pytest.raises(render_docs.RenderError, match="no stored result nope"):
        render_docs.render_text("<!--gc:nope/a-->1<!--/gc-->", results)
    with pytest.raises(render_docs.RenderError, match="matches 0 items"):
        render_docs.render_text("<!--gc:x/rows[N=5].v-->1<!--/gc-->", results)


def test_runs_compare_their_deterministic_part():
    a = {"rows": [{"psnr": 40.0, "mask": "1010"}]}
    assert runs.differences(a, json.loads(json.dumps(a))) == []
    assert runs.differences(a, {"rows": [{"psnr": 40.01, "mask": "1010"}]}) == []  # the last digit of a rounding
    assert runs.differences(a, {"rows": [{"psnr": 40.1, "mask": "1010"}]}) == [".rows[0].psnr: stored 40.0, now 40.1"]
    assert runs.differences(a, {"rows": [{"psnr": 40.0, "mask": "1100"}]})


def test_a_picture_is_its_stored_results_drawing(tmp_path, monkeypatch):
    """README's first figure is drawn from peers.json (bench/peers_plot.py): the committed file has the drawing's
    pixels, and one pixel changed is found."""
    from PIL import Image
    results = render_docs.Results()
    assert render_docs.render_images(results, write=False) == []
    monkeypatch.setattr(store, "REPO", str(tmp_path))
    (tmp_path / "docs").mkdir()
    img = render_docs.IMAGES["docs/peers_flux.png"](results)
    img.putpixel((5, 5), (1, 2, 3))
    img.save(tmp_path / "docs" / "peers_flux.png")
    assert render_docs.render_images(results, write=False) == [str(tmp_path / "docs" / "peers_flux.png")]
    assert render_docs.render_images(results, write=True) and render_docs.render_images(results, write=False) == []
    assert Image.open(tmp_path / "docs" / "peers_flux.png").getpixel((5, 5)) == (255, 255, 255)


def _rule_evidence() -> dict:
    """Each rule's prose in docs/search.md (search/paired.py's rules), as the blocks render it."""
    blocks()
    results = render_docs.Results()
    return {name: render_docs.BLOCKS[name](results) for name in
            ("polish_guard.prose", "choice_regret.prose", "forecaster_check.prose", "fresh_choice.prose")}


def test_each_rules_evidence_says_its_ties_and_worst_case():
    """The ties and the worst case of each rule against the rule it was compared with, counted here from the stored
    runs themselves (not from the summaries the blocks read)."""
    prose = _rule_evidence()
    load = lambda name: store.load(name)["result"]  # noqa: E731
    polish = [r["guards"]["z"]["psnr"] - r["guards"]["halves"]["psnr"]
              for n in ("polish_guard_48", "polish_guard_64") for r in load(n)["runs"]]
    assert f"tied in {sum(d == 0 for d in polish)} of {len(polish)}" in prose["polish_guard.prose"]
    assert f"at worst {render_docs.num(min(polish), '+.2f')} dB" in prose["polish_guard.prose"]
    with open(store.result_path("choice_regret"), encoding="utf-8") as f:
        rows = json.load(f)["rows"]
    ties = sum(r["regret"]["z=0"] == r["regret"]["z=2"] for r in rows)
    assert f"tied in {ties})" in prose["choice_regret.prose"]
    assert f"{max(r['regret']['z=0'] for r in rows):.2f} dB (better in" in prose["choice_regret.prose"]
    check = load("forecaster_check")["runs"]
    kept = sum(r["picks"]["halves"]["forecaster"] == r["picks"]["never"]["forecaster"] for r in check)
    worst = min(r["picks"]["halves"]["gain_db"] for r in check)
    assert f"kept it in {kept} (tied with never switching)" in prose["forecaster_check.prose"]
    assert f"worst held-out gain over keeping the candidate's forecaster was {render_docs.num(worst, '+.2f')} dB" \
        in prose["forecaster_check.prose"]
    fresh = load("fresh_choice")["runs"]
    d = [r["picks"]["z=1"]["regret_db"] - r["picks"]["never"]["regret_db"] for r in fresh]
    assert (f"never: better in {sum(v < 0 for v in d)}, worse in {sum(v > 0 for v in d)}, tied in "
            f"{sum(v == 0 for v in d)})") in prose["fresh_choice.prose"]
    replaced = sum(r["picks"]["z=1"]["key"] != r["picks"]["never"]["key"] for r in fresh)
    assert f"worst {max(r['picks']['z=1']['regret_db'] for r in fresh):.2f} dB, {replaced} replacements" in \
        prose["fresh_choice.prose"]
