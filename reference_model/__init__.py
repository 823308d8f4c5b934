"""The bundled reference model (tiny class-conditional DiT on scikit-learn's digits) and its sampler."""
