"""Where a get batch's pages land: one buffer a page (``get``) or several runs a page
(``get_scatter``), kept as columns so that a run of consecutive pages is laid out for
``preadv`` by slicing, without a Python step per page."""

from __future__ import annotations


class Dest:
    """A batch's destination buffers (flat unsigned-byte views, checked by the caller).

    ``columns[j][pos]`` is run j of page ``pos`` when every page has the same number of
    runs (``get``: one column of one buffer a page); ``columns`` is empty when the pages
    have different numbers of runs. Not mutated after construction but for a cache of
    ``pages()``, which any thread may fill (they all fill it with equal lists).
    """

    __slots__ = ("_pages", "columns", "width")

    def __init__(
        self, columns: list[list[memoryview]], pages: list[list[memoryview]] | None, width: int
    ) -> None:
        self.columns = columns
        self.width = width  # the most runs a page has
        self._pages = pages

    @staticmethod
    def flat(views: list[memoryview]) -> Dest:
        """One buffer a page."""
        return Dest([views], None, 1)

    @staticmethod
    def scatter(runs: list[list[memoryview]]) -> Dest:
        """``runs[pos]``: page ``pos``'s runs, in order."""
        widths = set(map(len, runs))
        width = max(widths, default=1)
        if len(widths) == 1 and width > 0:
            return Dest([list(column) for column in zip(*runs, strict=True)], runs, width)
        return Dest([], runs, width)

    def pages(self) -> list[list[memoryview]]:
        """Each page's runs (built from the columns on first use)."""
        pages = self._pages
        if pages is None:
            pages = self._pages = [list(page) for page in zip(*self.columns, strict=True)]
        return pages

    def page(self, pos: int) -> list[memoryview]:
        """Page ``pos``'s runs."""
        if self._pages is not None:
            return self._pages[pos]
        return [column[pos] for column in self.columns]

    def span(self, start: int, stop: int) -> list[list[memoryview]]:
        """The columns of pages ``start`` to ``stop`` (only when ``columns`` is not empty)."""
        return [column[start:stop] for column in self.columns]
