"""What a GCache-patched clone does with a sampling run: one mode per file.

base.py (what every mode's config shares, and where a run sits in its schedule), apply.py (sample under a policy),
profile.py (sample normally and add the run's residual errors to a profile file), auto.py (find or make this
model's policy: apply it, or profile this run first). A config is a flat record the node puts on the clone;
`config.start_run(...)` makes the run's RunState (../patching/runtime.py) and says at its close what the run did
(log lines, files). A change to what a run computes, records, saves or logs belongs here; how GCache reaches the
model's blocks belongs to ../patching.
"""
