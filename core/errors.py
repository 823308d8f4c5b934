"""One exception type for every bad input a user can fix.

Messages say what is wrong *and* what to do; callers (nodes, CLI) show them as they are. A caller that does
something about the problem itself (GCache Apply (auto) moves a damaged file aside and profiles again) says what it
did instead of the advice: `problem` is the message without it, `fix` the advice alone.
"""


class GCacheError(ValueError):
    """A user-fixable problem: bad file, bad mask, mismatched profile, missing backbone…"""

    def __init__(self, problem: str = "", fix: str = ""):
        super().__init__(f"{problem} {fix}" if fix else problem)
        self.problem, self.fix = problem, fix
