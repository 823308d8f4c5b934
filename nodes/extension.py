"""The ComfyUI extension: the node list (imported only by the package's comfy_entrypoint)."""
from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from .apply_node import GCacheApply
from .policy_node import GCachePolicy
from .comfy_common import register_folder
from .profile_node import GCacheLoadProfile, GCacheProfile
from .search_node import GCacheSearch


class GCacheExtension(ComfyExtension):
    async def on_load(self) -> None:
        register_folder()

    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [GCacheApply, GCacheProfile, GCachePolicy, GCacheSearch, GCacheLoadProfile]
