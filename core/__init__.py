"""Torch-only runtime: Policy, the residual-reuse engine, Profile recording, propagation weights."""
from .engine import CacheStats, ResidualCache
from .errors import GCacheError
from .policy import Policy, check_budget, predicted_speedup
from .profile import Profile, ProfileRecorder
from .weights import analytic_w, bernstein_w

__all__ = ["CacheStats", "ResidualCache", "GCacheError", "Policy", "check_budget", "predicted_speedup", "Profile",
           "ProfileRecorder", "analytic_w", "bernstein_w"]
