"""A context entered again and again, one inside another too, that acts at the outermost."""


class Outermost:
    """``begin()`` as the outermost entry begins, ``end()`` as it ends; an entry inside it
    joins it.  One object, entered again and again: a generator's context cost more than
    the work it wrapped (the daemon's batched writes and held log lines, twice per claim
    and release).  Entered on one thread only."""

    __slots__ = ("begin", "end", "depth")

    def __init__(self, begin, end):
        self.begin, self.end, self.depth = begin, end, 0

    def __enter__(self) -> None:
        if not self.depth:
            self.begin()
        self.depth += 1

    def __exit__(self, *_) -> None:
        self.depth -= 1
        if not self.depth:
            self.end()
