"""What a message shows a user (core/user_text.py, headless): user input cut to a readable length, server files by
their names in the gcache folder, never absolute paths; and a GCacheError's problem apart from its advice."""
import pickle

import pytest

from gcache.core.errors import GCacheError
from gcache.core.files import safe_name
from gcache.core.user_text import NAME_LIMIT, quoted, without_server_paths

FOLDERS = {"/srv/ComfyUI/models/gcache": "models/gcache", "/mnt/shared gcache": "shared gcache"}


def test_quoted_cuts_long_input_with_an_ellipsis():
    assert quoted("my_policy") == "'my_policy'" and quoted(3) == "3"
    long = quoted("x" * 5000)
    assert len(long) == NAME_LIMIT == 80 and long == "'" + "x" * 78 + "…"
    assert quoted("y" * 78) == "'" + "y" * 78 + "'"  # 80 characters: not cut
    with pytest.raises(GCacheError) as e:
        safe_name("a/" + "z" * 5000, "policy name")
    assert len(str(e.value)) < 300 and "zzz…" in str(e.value)


@pytest.mark.parametrize("text, shown", [
    ("the gcache folder /srv/ComfyUI/models/gcache can't be written (Permission denied)",
     "the gcache folder models/gcache can't be written (Permission denied)"),
    ("[Errno 13] Permission denied: '/srv/ComfyUI/models/gcache/.tmp-x1'", "[Errno 13] Permission denied: '.tmp-x1'"),
    ("/srv/ComfyUI/models/gcache/sub/p.json is damaged.", "sub/p.json is damaged."),  # relative to the folder
    ("Can't lock a.json in /srv/ComfyUI/models/gcache (busy)", "Can't lock a.json in models/gcache (busy)"),
    ("No policy file at /mnt/shared gcache/p.json.", "No policy file at p.json."),  # a folder with a space
    ("the gcache folder /mnt/shared gcache.", "the gcache folder shared gcache."),
    ("/srv/ComfyUI/models/gcache2/x.json", "x.json"),  # another folder: its last part only
    ("/home/u/ComfyUI/models/gcache/a.search.json", "a.search.json"),
    (r"C:\ComfyUI\models\gcache\x.json is locked", "x.json is locked"),
    # not paths: left alone
    ("computed 3/8 steps, 12 of 30 evaluations", "computed 3/8 steps, 12 of 30 evaluations"),
    ("from https://download.pytorch.org/models/alexnet.pth", "from https://download.pytorch.org/models/alexnet.pth"),
    ("models/gcache/x.json", "models/gcache/x.json"),
])
def test_without_server_paths_names_files_in_the_gcache_folder_by_their_names(text, shown):
    assert without_server_paths(text, FOLDERS) == shown
    assert "/srv" not in without_server_paths(text, {}) and "/mnt" not in without_server_paths(text, {})


def test_a_gcache_error_keeps_its_problem_apart_from_its_advice():
    e = GCacheError("x.profile.safetensors is damaged.", "Delete it and profile again.")
    assert str(e) == "x.profile.safetensors is damaged. Delete it and profile again."
    assert (e.problem, e.fix) == ("x.profile.safetensors is damaged.", "Delete it and profile again.")
    plain = GCacheError("K must be a whole number.")
    assert str(plain) == plain.problem == "K must be a whole number." and plain.fix == ""
    back = pickle.loads(pickle.dumps(e))  # errors cross processes (the Ray cluster search): the message survives
    assert isinstance(back, GCacheError) and str(back) == str(e)
