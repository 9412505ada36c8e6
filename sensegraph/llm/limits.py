"""Request and token rate limits over a sliding 60-second window, and retry back-off."""
from __future__ import annotations

import asyncio
import math
import random
import time
from collections import deque
from typing import Any


class Reservation:
    """One request's place in a limiter's window: when it was admitted and the tokens it holds."""

    __slots__ = ("at", "tokens", "live")

    def __init__(self, at: float, tokens: int):
        self.at = at
        self.tokens = tokens
        self.live = True  # False once it has left the window


class RateLimiter:
    """Waits until a request of `tokens` fits under requests/minute and tokens/minute (0 = off).

    A request reserves an estimate (its prompt plus `max_tokens`) when it is admitted, and
    `settle` replaces that by what the reply says it used: extraction reserved ~4,800 tokens
    and used ~2,300, so without the correction a tokens-per-minute limit admitted half the
    requests it allows."""

    def __init__(self, requests_per_minute: int = 0, tokens_per_minute: int = 0, window: float = 60.0):
        self.rpm = requests_per_minute
        self.tpm = tokens_per_minute
        self.window = window
        self._events: deque[Reservation] = deque()
        self._tokens = 0
        self._lock = asyncio.Lock()

    @property
    def enabled(self) -> bool:
        return bool(self.rpm or self.tpm)

    def fits(self, tokens: int, now: float | None = None) -> bool:
        """Whether a request of `tokens` would be admitted now."""
        now = time.monotonic() if now is None else now
        while self._events and self._events[0].at <= now - self.window:
            gone = self._events.popleft()
            gone.live = False
            self._tokens -= gone.tokens
        fits_rpm = not self.rpm or len(self._events) < self.rpm
        # A single request larger than the whole budget still goes, alone in its window.
        fits_tpm = not self.tpm or self._tokens + tokens <= self.tpm or not self._events
        return fits_rpm and fits_tpm

    async def acquire(self, tokens: int) -> Reservation | None:
        """Wait until a request of `tokens` fits; its reservation (None when nothing is limited)."""
        if not self.enabled:
            return None
        async with self._lock:
            while True:
                now = time.monotonic()
                if self.fits(tokens, now):
                    reservation = Reservation(now, tokens)
                    self._events.append(reservation)
                    self._tokens += tokens
                    return reservation
                await asyncio.sleep(max(0.01, self._events[0].at + self.window - now))

    def settle(self, reservation: Reservation | None, tokens: int) -> None:
        """The request of `reservation` used `tokens` (the reply's usage): count that instead of
        the estimate. Nothing to do once the reservation has left the window."""
        if reservation is None or not reservation.live or tokens <= 0:
            return
        self._tokens += tokens - reservation.tokens
        reservation.tokens = tokens


def backoff_delay(attempt: int, base: float, cap: float = 60.0, retry_after: float | None = None) -> float:
    """Exponential back-off with full jitter; a server's Retry-After is a floor, never ignored."""
    delay = min(cap, base * (2**attempt)) * random.uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, retry_after)
    return delay


# The longest Retry-After obeyed. A server asking for an hour (or "inf") would otherwise stall
# the run on it; past this the outage rules (endpoints.py) decide, and other servers are tried.
RETRY_AFTER_CAP = 60.0


def parse_retry_after(value: str | None, *, milliseconds: bool = False) -> float | None:
    """Seconds from a Retry-After value (seconds or an HTTP date; with `milliseconds`, the
    `retry-after-ms` header's number), capped at RETRY_AFTER_CAP; None when absent or garbage
    ("inf" and "nan" are garbage, never an infinite pause)."""
    if not value:
        return None
    try:
        seconds = float(value) / (1000.0 if milliseconds else 1.0)
    except ValueError:
        if milliseconds:
            return None
        from email.utils import parsedate_to_datetime

        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    if not math.isfinite(seconds):
        return None
    return min(RETRY_AFTER_CAP, max(0.0, seconds))


def retry_after_of(headers: Any) -> float | None:
    """The pause a 429's headers ask for: `retry-after-ms` (OpenAI, Azure) wins over
    `retry-after`, as the more precise of the two."""
    if headers is None:
        return None
    ms = parse_retry_after(headers.get("retry-after-ms"), milliseconds=True)
    return ms if ms is not None else parse_retry_after(headers.get("retry-after"))
