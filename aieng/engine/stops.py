"""Stop strings: cut the output at the first stop string, and never stream part of one.

Text that could be the beginning of a stop string is held back until the next delta shows
whether it is one; the stop string itself is never returned (OpenAI semantics).
"""

from __future__ import annotations


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.held = ""
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Return the text safe to emit now; sets ``stopped`` when a stop string appeared."""
        if not self.stops:
            return delta
        text = self.held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i != -1), default=-1)
        if cut != -1:
            self.held, self.stopped = "", True
            return text[:cut]
        keep = self._partial_suffix(text)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held

    def _partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:n]):
                    best = n
                    break
        return best
