"""The bundled reference model (tiny class-conditional DiT on scikit-learn's digits), its sampler, and the headless
commands that run on it: demo, search, cluster (the search on Ray), train."""
