"""Real-ComfyUI suite: runs only when COMFYUI_PATH points to a ComfyUI checkout."""
import os
import sys

import pytest

COMFY = os.environ.get("COMFYUI_PATH")
REASON = ("COMFYUI_PATH is not set: the real-ComfyUI suite needs a ComfyUI checkout "
          "(COMFYUI_PATH=/path/to/ComfyUI pytest tests/comfyui); see docs/development.md").strip()
collect_ignore = ["gcache_test_pack", "tiny_models.py", "tiny_image_models.py", "tiny_video_models.py",
                  "comfy_server.py"]

if COMFY:
    if not os.path.isfile(os.path.join(COMFY, "comfy", "model_patcher.py")):
        raise pytest.UsageError(f"COMFYUI_PATH={COMFY} is not a ComfyUI checkout (no comfy/model_patcher.py).")
    sys.path.insert(0, COMFY)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import comfy.cli_args
    import torch

    comfy.cli_args.args.cpu = not torch.cuda.is_available()  # before comfy.model_management picks a device


    @pytest.fixture(scope="module")
    def flux():
        """tiny_models' Flux, built once per test module (a module defining its own `flux` uses that one)."""
        import tiny_models
        return tiny_models.flux()


    @pytest.fixture()
    def gcache_dir(tmp_path):
        """models/gcache pointed at a fresh folder for one test (and back afterwards)."""
        import folder_paths
        old = folder_paths.folder_names_and_paths.get("gcache")
        folder_paths.folder_names_and_paths["gcache"] = ([str(tmp_path)], {".json", ".safetensors"})
        yield tmp_path
        if old is None:
            folder_paths.folder_names_and_paths.pop("gcache", None)
        else:
            folder_paths.folder_names_and_paths["gcache"] = old


    @pytest.fixture()
    def queue(monkeypatch):
        """A fresh background Jobs; ComfyUI's queue as a list of the slice prompts queued (test_search_jobs.py,
        test_search_requeue.py)."""
        from gcache.nodes.search_jobs import background
        queued = []
        monkeypatch.setattr(background, "JOBS", background.Jobs())
        monkeypatch.setattr(background, "queue_prompt", lambda prompt, client_id=None: queued.append(prompt) or
                            f"p{len(queued)}")
        return queued
