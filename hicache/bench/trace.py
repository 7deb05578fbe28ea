"""Seeded synthetic request traces shared by the benchmarks."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple


class TraceRequest(NamedTuple):
    """One request: its full prompt, and how many of its last tokens the model answers."""

    conversation: int
    turn: int
    tokens: list[int]
    output_len: int


@dataclass(frozen=True)
class MultiTurnSpec:
    """N conversations × R turns; each turn appends the previous answer and a new question."""

    conversations: int = 200
    turns: int = 8
    system_prompts: int = 8
    system_tokens: tuple[int, int] = (512, 1024)
    question_tokens: tuple[int, int] = (100, 500)
    answer_tokens: tuple[int, int] = (50, 300)
    vocab: int = 32000
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("conversations", "turns", "system_prompts", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        for name in ("system_tokens", "question_tokens", "answer_tokens"):
            lo, hi = getattr(self, name)
            if not 0 <= lo <= hi:
                raise ValueError(f"{name} must be a range lo <= hi, got {(lo, hi)}")


def _rand_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def multiturn(spec: MultiTurnSpec) -> Iterator[TraceRequest]:
    """Yield requests round by round, clients shuffled within a round so that
    the distance between two turns of one conversation is long."""
    rng = random.Random(spec.seed)
    systems = [
        _rand_tokens(rng, rng.randint(*spec.system_tokens), spec.vocab)
        for _ in range(spec.system_prompts)
    ]
    history = [list(systems[c % spec.system_prompts]) for c in range(spec.conversations)]
    for turn in range(spec.turns):
        order = list(range(spec.conversations))
        rng.shuffle(order)
        for conv in order:
            history[conv] += _rand_tokens(rng, rng.randint(*spec.question_tokens), spec.vocab)
            answer = _rand_tokens(rng, rng.randint(*spec.answer_tokens), spec.vocab)
            yield TraceRequest(conv, turn, history[conv] + answer, len(answer))
            history[conv] += answer
