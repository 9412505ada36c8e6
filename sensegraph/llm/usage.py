"""Usage accounting per pipeline step: calls, tokens, cache hits, retries, failures, cost."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class StepUsage:
    calls: int = 0  # requests that reached the server and returned an answer we kept
    cache_hits: int = 0
    requests: int = 0  # every HTTP request made, retries included
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failures: list[str] = field(default_factory=list)  # items that failed after every retry

    def add(self, other: "StepUsage") -> None:
        self.calls += other.calls
        self.cache_hits += other.cache_hits
        self.requests += other.requests
        self.retries += other.retries
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.failures.extend(other.failures)


class Usage:
    """Counters keyed by step name ("extract", "claims", "summarize", "community_reports", "embed", ...)."""

    def __init__(self, price_per_1k_prompt: float = 0.0, price_per_1k_completion: float = 0.0):
        self.steps: dict[str, StepUsage] = {}
        self.price_prompt = price_per_1k_prompt
        self.price_completion = price_per_1k_completion

    def step(self, name: str) -> StepUsage:
        if name not in self.steps:
            self.steps[name] = StepUsage()
        return self.steps[name]

    def total(self) -> StepUsage:
        out = StepUsage()
        for s in self.steps.values():
            out.add(s)
        return out

    def cost(self, step: str | None = None) -> float:
        s = self.total() if step is None else self.step(step)
        return (s.prompt_tokens * self.price_prompt + s.completion_tokens * self.price_completion) / 1000

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: asdict(s) for name, s in sorted(self.steps.items())}
        out["total"] = asdict(self.total())
        if self.price_prompt or self.price_completion:
            out["total"]["cost"] = round(self.cost(), 6)
        return out
