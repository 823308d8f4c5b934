"""GCache inside ComfyUI: the only code that imports ComfyUI (core/ and search/ stay headless).

Here, at the top: the node classes (apply_node.py, profile_node.py, policy_node.py, search_node.py), the extension
that lists them (extension.py, reached from the pack's comfy_entrypoint), what they share inside ComfyUI
(comfy_common.py: category, sockets, combo labels, the models/gcache folder) and the artifacts' file names
(artifacts.py, no ComfyUI). Below them, three rooms, each on the ones under it: search_jobs/ (GCache Search's work:
reference runs, evaluations, background slices), modes/ (what a patched clone does with a run: apply, profile,
auto), patching/ (wiring GCache into a ModelPatcher, the block-stack gate, step attribution). Imports go down, never
up (tests/test_nodes_layers.py).
"""
