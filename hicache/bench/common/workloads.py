"""Seeded, reproducible request workloads shared by the benchmarks.

- ``multiturn``: N clients × R rounds; each round appends the previous answer
  and a new question; clients share a few system prompts, and the order of
  clients is shuffled each round so the reuse distance is long (as in
  SGLang's bench_multiturn).
- ``longdoc``: a few long shared documents × many questions each, questions
  interleaved across documents (as in LMCache's long-doc QA).
- ``fewshot``: a few shared few-shot prefixes, each followed by a new query.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple


class TraceRequest(NamedTuple):
    """One request: its full prompt plus the answer tokens it generates.

    ``output_len`` is the number of trailing tokens the model answers (their
    KV is computed during decode); ``round`` groups requests for reporting.
    """

    conversation: int
    turn: int
    tokens: list[int]
    output_len: int

    @property
    def round(self) -> int:
        return self.turn


def _check_range(name: str, value: tuple[int, int]) -> None:
    lo, hi = value
    if not 0 <= lo <= hi:
        raise ValueError(f"{name} must be a range lo <= hi, got {value}")


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
            _check_range(name, getattr(self, name))


@dataclass(frozen=True)
class LongDocSpec:
    """A few long documents, each asked many questions."""

    documents: int = 8
    questions: int = 10
    document_tokens: tuple[int, int] = (6000, 10000)
    question_tokens: tuple[int, int] = (50, 200)
    answer_tokens: tuple[int, int] = (50, 200)
    vocab: int = 32000
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.documents, self.questions, self.vocab) < 1:
            raise ValueError("documents, questions and vocab must be >= 1")
        for name in ("document_tokens", "question_tokens", "answer_tokens"):
            _check_range(name, getattr(self, name))


@dataclass(frozen=True)
class FewShotSpec:
    """Shared few-shot prefixes, each followed by many different queries."""

    prefixes: int = 16
    queries: int = 20
    prefix_tokens: tuple[int, int] = (2000, 4000)
    query_tokens: tuple[int, int] = (50, 300)
    answer_tokens: tuple[int, int] = (20, 100)
    vocab: int = 32000
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.prefixes, self.queries, self.vocab) < 1:
            raise ValueError("prefixes, queries and vocab must be >= 1")
        for name in ("prefix_tokens", "query_tokens", "answer_tokens"):
            _check_range(name, getattr(self, name))


def _rand_tokens(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def multiturn(spec: MultiTurnSpec) -> Iterator[TraceRequest]:
    """Yield requests round by round, clients shuffled within a round."""
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


def _shared_prefix_trace(
    rng: random.Random,
    prefixes: list[list[int]],
    rounds: int,
    tail: Callable[[], tuple[list[int], list[int]]],
) -> Iterator[TraceRequest]:
    for rnd in range(rounds):
        order = list(range(len(prefixes)))
        rng.shuffle(order)
        for idx in order:
            query, answer = tail()
            yield TraceRequest(idx, rnd, prefixes[idx] + query + answer, len(answer))


def longdoc(spec: LongDocSpec) -> Iterator[TraceRequest]:
    """Round r asks every document its r-th question, documents shuffled."""
    rng = random.Random(spec.seed)
    docs = [
        _rand_tokens(rng, rng.randint(*spec.document_tokens), spec.vocab)
        for _ in range(spec.documents)
    ]

    def tail() -> tuple[list[int], list[int]]:
        q = _rand_tokens(rng, rng.randint(*spec.question_tokens), spec.vocab)
        return q, _rand_tokens(rng, rng.randint(*spec.answer_tokens), spec.vocab)

    return _shared_prefix_trace(rng, docs, spec.questions, tail)


def fewshot(spec: FewShotSpec) -> Iterator[TraceRequest]:
    """Round r sends one new query behind every few-shot prefix."""
    rng = random.Random(spec.seed)
    prefixes = [
        _rand_tokens(rng, rng.randint(*spec.prefix_tokens), spec.vocab)
        for _ in range(spec.prefixes)
    ]

    def tail() -> tuple[list[int], list[int]]:
        q = _rand_tokens(rng, rng.randint(*spec.query_tokens), spec.vocab)
        return q, _rand_tokens(rng, rng.randint(*spec.answer_tokens), spec.vocab)

    return _shared_prefix_trace(rng, prefixes, spec.queries, tail)
