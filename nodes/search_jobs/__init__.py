"""GCache Search's work inside ComfyUI, in the foreground or in background slices.

job.py (one search: its reference runs, its profile, evaluate(mask) through a patched clone, a slice of
evaluations), background.py (the searches this ComfyUI process runs: slice prompts queued through ComfyUI's own
queue, the panel's routes and events), sampling.py (sampling and decoding inside a node, as KSampler and VAE Decode
do). The search itself (DP, GP-LCB, state file) is ../../search; the node is ../search_node.py. A change to how a
search samples, resumes, reports or is listed belongs here. Sits on ../modes and ../patching, never on a node class.
"""
