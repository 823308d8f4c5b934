"""Torch-only runtime: Policy, the residual-reuse engine and its observers (profile recording, the step clock),
propagation weights."""
from .engine import CacheStats, ResidualCache
from .errors import GCacheError
from .observer import EngineObserver
from .policy import Policy, check_budget, predicted_speedup
from .profile import Profile
from .recorder import ProfileRecorder
from .step_clock import StackClock, StepClock
from .weights import analytic_w, bernstein_w

__all__ = ["CacheStats", "ResidualCache", "EngineObserver", "GCacheError", "Policy", "check_budget",
           "predicted_speedup", "Profile", "ProfileRecorder", "StackClock", "StepClock", "analytic_w", "bernstein_w"]
