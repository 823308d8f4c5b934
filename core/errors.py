"""One exception type for every bad input a user can fix.

Messages say what is wrong *and* what to do; callers (nodes, CLI) show them as they are.
"""


class GCacheError(ValueError):
    """A user-fixable problem: bad file, bad mask, mismatched profile, missing backbone…"""
