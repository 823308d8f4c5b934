"""The search's infrastructure: executors beyond this process (threads, Ray actors, ComfyUI servers), the objectives
and their downloaded backbone, plots, what the command-line tools share, and the optional packages' check. It stands
on the algorithm in ../ (never the other way round); the map is in ../__init__.py."""
