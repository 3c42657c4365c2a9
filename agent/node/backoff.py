"""Reconnect delays: exponential backoff with full jitter, so a fleet does not reconnect in step.

After the n-th failure in a row (a session that ended, a connect refused or timed out) bcd
waits a delay drawn uniformly from [0, min(cap, base * 2**n)]: "full jitter" (AWS
Architecture Blog, "Exponential Backoff And Jitter"). A fleet whose sessions all drop at
once (the server restarted) spreads its reconnects over the whole window, which doubles with
each refusal, instead of arriving together at each step. A session that got as far as
Welcome resets the count.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    base: float = 0.5
    cap: float = 30.0
    random: Callable[[], float] = field(default=random.random)
    failures: int = 0

    def next_delay(self) -> float:
        """The delay before the next attempt; counts one more failure."""
        ceiling = min(self.cap, self.base * 2 ** min(self.failures, 30))
        self.failures += 1
        return float(ceiling * self.random())

    def reset(self) -> None:
        self.failures = 0
