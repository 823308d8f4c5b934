"""Wiring GCache into a ComfyUI ModelPatcher clone, and attributing every model call to its sampler step.

hooks.py (the clone, three wrappers keyed "gcache", the block patches; the RunConfig protocol it needs from a mode),
runtime.py (RunState: one sampling run, its lanes and the one block-stack gate), foreign.py (other nodes' patches in
GCache's slots, and calls with patches of their own), adapters.py (the family table), family_paths.py (which of its
class paths this ComfyUI has), streams.py (where a stream's image tokens are), steps.py (step attribution, schedule
placement), companions.py (TorchCompileModel, EasyCache beside GCache), memory_compiler.py (ComfyUI's memory compiler,
each generation after 0.33), content_hash.py. A change to *how* GCache reaches a model or a step belongs here; what
a run does with it (apply, profile, auto) belongs to ../modes. Nothing here imports a mode or a node class; only
hooks.py, companions.py, memory_compiler.py and family_paths.py import ComfyUI (the last two only inside functions;
the rest is tested headlessly).
"""
