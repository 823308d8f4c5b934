"""GCache for ComfyUI: globally optimized residual caching for diffusion transformers.

ComfyUI imports this folder as a package (under whatever name it was cloned as) and calls
`comfy_entrypoint()`. Only that function reaches into `nodes/`, which is the only code that imports
ComfyUI; `core/` and `search/` stay headless.
"""

from .core.version import VERSION as __version__  # noqa: E402, F401  (core/version.py imports nothing)

WEB_DIRECTORY = "./web"  # web/gcache.js: the panel of background searches (ComfyUI serves it to its frontend)


async def comfy_entrypoint():
    from .nodes.extension import GCacheExtension  # imports ComfyUI: only ever inside ComfyUI

    return GCacheExtension()
