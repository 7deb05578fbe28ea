"""Requests, their results, and the scheduler's per-request progress."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from hicache.tree.radix_tree import TreeNode


@dataclass(frozen=True)
class Request:
    """Generate ``max_new_tokens`` tokens (greedy) after ``prompt``; the cache is
    partitioned by ``namespace``."""

    request_id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    namespace: str | None = None

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError(f"request {self.request_id!r}: empty prompt")
        if self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: max_new_tokens must be >= 1")


class TierHits(NamedTuple):
    """Prompt tokens whose KV was reused from each tier, as matched by the
    admission whose prefill produced the request's first token.

    ``host`` counts tokens loaded back from host memory, ``storage`` those
    prefetched from storage (then loaded back through host memory)."""

    device: int
    host: int
    storage: int

    @property
    def total(self) -> int:
        return self.device + self.host + self.storage


class RequestOutput(NamedTuple):
    """A finished request: generated tokens, the float32 logits of the last
    step (``[vocab]``), its cache hits, time to first token (seconds since
    ``submit``) and how often it was retracted."""

    request_id: str
    output_tokens: tuple[int, ...]
    final_logits: torch.Tensor
    hits: TierHits
    ttft_s: float
    retractions: int


@dataclass
class ReqState:
    """Where one request stands; owned and mutated by the scheduler only.

    ``tokens`` is the prompt plus the tokens generated so far. The KV of
    ``tokens[:computed]`` is at ``slots[:computed]``; ``slots`` is always whole
    pages. The first ``tree_len`` slots belong to the cache's tree and are
    pinned by the lock on ``last_node``; the rest are the request's own.
    """

    request: Request
    arrival: float
    cache_id: str  # unique per submission; names the request's storage prefetch
    tokens: list[int] = field(default_factory=list)
    slots: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    computed: int = 0
    tree_len: int = 0
    last_node: TreeNode | None = None
    decoding: bool = False
    prefetch_checked: bool = False
    prefetching: bool = False
    fetched: int = 0
    hits: TierHits | None = None
    first_token_at: float | None = None
    logits: torch.Tensor | None = None
    retractions: int = 0

    def __post_init__(self) -> None:
        if not self.tokens:
            self.tokens = list(self.request.prompt)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def outputs(self) -> list[int]:
        return self.tokens[len(self.request.prompt) :]

    @property
    def reusable(self) -> list[int]:
        """Tokens whose KV may come from the cache: all but the last, which must
        be computed to produce logits."""
        return self.tokens[:-1]

    @property
    def finished(self) -> bool:
        return len(self.outputs) >= self.request.max_new_tokens

    def output(self) -> RequestOutput:
        """The result of a finished request."""
        assert self.logits is not None and self.hits is not None
        assert self.first_token_at is not None
        return RequestOutput(
            self.request_id,
            tuple(self.outputs),
            self.logits,
            self.hits,
            self.first_token_at - self.arrival,
            self.retractions,
        )
