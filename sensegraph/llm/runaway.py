"""A structured answer that has run away: the model counts, 1, 2, 3, ... until max_tokens.

The embedded 1.5B writes a community report's citations as `[Data: Entities (101, 33, 34, ...`
and now and then falls into counting, number after number, until the answer is cut off at
reports.max_tokens (1,500 tokens): every report it lost in the stop-49 and stop-50 indexes was
this loop, about a third of the reports step's time. The answer would be rejected at the end
anyway (cut off); reading the stream, the client sees the loop start and stops the request
there, a few hundred tokens in instead of 1,500, and the retry asks again varied (llm/client.py).

A run counts only inside a JSON string: a list of numbers the schema asks for (the numbers a
model picked among those it was shown) may legitimately be 1, 2, 3 ... when it picks them all.
Nobody's text spells out twenty numbers counting up one by one; a strong model never does.
"""
from __future__ import annotations

import re

from .transport import Retryable

# Numbers in a row, each one more than the one before, that make a run. The 1.5B's loops ran
# to the token limit (hundreds); a citation list the prompt asks for has at most 5 ids.
RUN = 20
_LIST = re.compile(r"\d+(?:\s*,\s*\d+){%d,}" % (RUN - 1))
_ESCAPE = re.compile(r"\\.")
TAIL = 40 * RUN  # how far back a streamed check looks: a run of RUN numbers of any sensible width


def counting_run(text: str, start: int = 0) -> str | None:
    """The first run of RUN or more numbers counting up by one, inside a JSON string of `text`,
    at or after `start` (with a few characters before it); None when there is none."""
    for found in _LIST.finditer(text, max(0, start)):
        numbers = [int(n) for n in re.findall(r"\d+", found.group())]
        longest = streak = 1
        for before, after in zip(numbers, numbers[1:]):
            streak = streak + 1 if after == before + 1 else 1
            longest = max(longest, streak)
        if longest >= RUN and _in_string(text, found.start()):
            return found.group()
    return None


def _in_string(text: str, at: int) -> bool:
    """Whether position `at` of JSON text lies inside a string (an odd number of unescaped
    quotes before it). Only asked when a run is found, so its cost does not matter."""
    return _ESCAPE.sub("", text[:at]).count('"') % 2 == 1


class RunawayAnswer(Retryable):
    """A structured answer that started counting: stopped, its text kept for `sensegraph doctor
    --rejected`, and retried varied (a deterministic server would count again)."""

    def __init__(self, run: str, received: str):
        shown = run if len(run) <= 80 else f"{run[:40]} ... {run[-30:]}"
        super().__init__(f"the answer started counting ({shown!r}): a model stuck in a loop, "
                         f"stopped after {len(received)} characters", answer=received, repeats=True)
