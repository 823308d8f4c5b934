"""The ComfyUI extension: the node list (imported only by the package's comfy_entrypoint)."""
from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .apply_node import GCacheApply
from .comfy_common import all_folders, register_folder, shown_folders
from .patching import family_paths
from .policy_node import GCachePolicy
from .profile_node import GCacheLoadProfile, GCacheProfile
from .search_jobs import background
from .search_node import GCacheSearch

_SET_UP = []


def _set_up() -> None:
    """Once per process: which of the family table's model classes this ComfyUI has, the models/gcache folder and the
    routes of the background-search panel (GET /gcache/searches, POST /gcache/searches/{id}/cancel). From
    get_node_list too: ComfyUI 0.3.64 never calls on_load."""
    if not _SET_UP:
        _SET_UP.append(True)
        family_paths.check()  # the family table's classes this ComfyUI lacks: left out, one log line
        register_folder()
        background.register_routes(all_folders, shown_folders)


class GCacheExtension(ComfyExtension):
    async def on_load(self) -> None:
        _set_up()

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        _set_up()
        return [GCacheApply, GCacheProfile, GCachePolicy, GCacheSearch, GCacheLoadProfile]
