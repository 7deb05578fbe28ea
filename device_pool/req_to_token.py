"""Request row -> token slot table, as in SGLang."""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """A ``[size, max_context_len]`` int64 table; row r lists request r's slots.

    ``alloc`` returns a free row index or ``None`` when all rows are taken;
    ``free`` raises ``ValueError`` for a row that is not in use. Owner thread only.
    """

    def __init__(self, size: int, max_context_len: int, device: torch.device | str = "cpu") -> None:
        if size < 1 or max_context_len < 1:
            raise ValueError("size and max_context_len must be >= 1")
        self.size = size
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int64, device=device)
        self._free_rows: list[int] = list(range(size - 1, -1, -1))
        self._used = [False] * size

    def available(self) -> int:
        return len(self._free_rows)

    def alloc(self) -> int | None:
        if not self._free_rows:
            return None
        row = self._free_rows.pop()
        self._used[row] = True
        return row

    def free(self, row: int) -> None:
        if not 0 <= row < self.size or not self._used[row]:
            raise ValueError(f"row {row} is not allocated")
        self._used[row] = False
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        """Record ``slots`` for positions ``start .. start+len`` of ``row``."""
        end = start + slots.numel()
        if not self._used[row] or end > self.max_context_len:
            raise ValueError(f"cannot write positions {start}..{end} of row {row}")
        self.req_to_token[row, start:end] = slots

    def read(self, row: int, end: int, start: int = 0) -> torch.Tensor:
        """A copy of positions ``start .. end`` of ``row``."""
        return self.req_to_token[row, start:end].clone()
