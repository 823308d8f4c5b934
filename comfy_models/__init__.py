"""Tiny trained models in ComfyUI's own classes (Flux, Wan 2.1): data, training, loading (see README there)."""
