"""Usage accounting per pipeline step: calls, tokens, cache hits, retries, failures, truncated
lists, cost."""
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
    # Prompt tokens the server reports it took from its prompt cache (llama.cpp slots, OpenAI
    # prompt caching): still counted in prompt_tokens, but not read again, and billed less.
    cached_prompt_tokens: int = 0
    failures: list[str] = field(default_factory=list)  # items that failed after every retry
    # Items whose call was not sent because the spending budget was used up: not a model
    # failure, and a rerun (with a larger budget) does them.
    budget_skipped: list[str] = field(default_factory=list)
    # Lists in kept answers that were longer than their schema's maxItems and were cut to their
    # first maxItems items (servers without constrained decoding do not stop at the limit).
    truncated: int = 0

    def add(self, other: "StepUsage") -> None:
        self.calls += other.calls
        self.cache_hits += other.cache_hits
        self.requests += other.requests
        self.retries += other.retries
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cached_prompt_tokens += other.cached_prompt_tokens
        self.failures.extend(other.failures)
        self.budget_skipped.extend(other.budget_skipped)
        self.truncated += other.truncated


class Usage:
    """Counters keyed by step name ("extract", "claims", "summarize", "community_reports", "embed", ...).

    Chat and embedding calls may share one Usage (the indexing pipeline does; the resolve step
    records both under one name), so chat tokens are also summed apart: they are what
    `chat.budget_tokens` counts and what the chat prices apply to. Every other token is an
    embedding token, priced at `price_per_1k_embedding` (by default the prompt price, which is
    right for a Usage that only an embedder writes to)."""

    def __init__(self, price_per_1k_prompt: float = 0.0, price_per_1k_completion: float = 0.0,
                 price_per_1k_embedding: float | None = None):
        self.steps: dict[str, StepUsage] = {}
        self.price_prompt = price_per_1k_prompt
        self.price_completion = price_per_1k_completion
        self.price_embedding = price_per_1k_prompt if price_per_1k_embedding is None else price_per_1k_embedding
        self.chat_prompt_tokens = 0
        self.chat_completion_tokens = 0
        # The endpoint pools ("chat", "embedding") of the clients writing here, for per-server
        # figures when a model has several servers (llm/endpoints.py).
        self.pools: dict[str, Any] = {}

    def endpoint_report(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Per-server usage of each model that has several servers (empty when none has)."""
        return {kind: pool.report() for kind, pool in sorted(self.pools.items()) if pool.several}

    def outages(self) -> dict[str, str]:
        """Per model, why its calls failed with no server left to answer (empty when none did)."""
        return {kind: pool.gave_up for kind, pool in sorted(self.pools.items()) if getattr(pool, "gave_up", None)}

    def step(self, name: str) -> StepUsage:
        if name not in self.steps:
            self.steps[name] = StepUsage()
        return self.steps[name]

    def add_chat(self, step: str, prompt_tokens: int, completion_tokens: int, cached_prompt_tokens: int = 0) -> None:
        """Tokens of one chat request (the chat client's only way of recording tokens)."""
        s = self.step(step)
        s.cached_prompt_tokens += cached_prompt_tokens
        s.prompt_tokens += prompt_tokens
        s.completion_tokens += completion_tokens
        self.chat_prompt_tokens += prompt_tokens
        self.chat_completion_tokens += completion_tokens

    def chat_tokens(self) -> int:
        return self.chat_prompt_tokens + self.chat_completion_tokens

    def total(self) -> StepUsage:
        out = StepUsage()
        for s in self.steps.values():
            out.add(s)
        return out

    def cost(self, step: str | None = None) -> float:
        if step is not None:
            s = self.step(step)
            return (s.prompt_tokens * self.price_prompt + s.completion_tokens * self.price_completion) / 1000
        t = self.total()
        other = t.prompt_tokens + t.completion_tokens - self.chat_tokens()
        return (self.chat_prompt_tokens * self.price_prompt + self.chat_completion_tokens * self.price_completion
                + other * self.price_embedding) / 1000

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: asdict(s) for name, s in sorted(self.steps.items())}
        out["total"] = asdict(self.total())
        if self.price_prompt or self.price_completion:
            out["total"]["cost"] = round(self.cost(), 6)
        return out
