"""Errors that name the ranks they came from, raised where the user called `run`."""

from __future__ import annotations


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r) for r in ranks)}"


class RankFailure(RuntimeError):
    """One or more ranks raised.

    `ranks`: the ranks whose failure is a cause (their own exception, or their engine died);
    `consequences`: ranks that failed only in communicating with a failed rank;
    `failures`: the traceback text of both, by rank; `exceptions`: the exception objects,
    where they could be brought back; `still_running`: ranks that had not finished a while
    after the failure, usually because they were waiting on a message from a failed rank.
    """

    def __init__(self, failures: dict[int, str], exceptions: dict[int, BaseException] | None = None,
                 still_running: list[int] | None = None, consequences: set[int] | None = None):
        self.failures = dict(sorted(failures.items()))
        self.exceptions = exceptions or {}
        causes = [r for r in self.failures if r not in (consequences or set())]
        self.ranks = causes or list(self.failures)
        self.consequences = [r for r in self.failures if r not in self.ranks]
        self.still_running = sorted(still_running or [])
        lines = [f"{_ranks(self.ranks)} failed"]
        if self.consequences:
            lines.append(f"{_ranks(self.consequences)} then failed in communication with it")
        if self.still_running:
            were = "were" if len(self.still_running) > 1 else "was"
            lines.append(f"{_ranks(self.still_running)} had not finished (waiting on a failed "
                         f"rank?) and {were} stopped")
        order = self.ranks + self.consequences
        lines += [f"--- rank {r} ---\n{self.failures[r].rstrip()}" for r in order]
        super().__init__("\n".join(lines))


class RankTimeout(RuntimeError):
    """No rank failed, but `ranks` did not finish within `timeout` seconds."""

    def __init__(self, ranks: list[int], timeout: float, detail: dict[int, str] | None = None):
        self.ranks = sorted(ranks)
        self.timeout = timeout
        lines = [f"{_ranks(self.ranks)} did not finish within {timeout:g} s (a deadlock, a "
                 f"collective that not every rank called, or an endless loop)"]
        lines += [f"  rank {r}: {what}" for r, what in sorted((detail or {}).items())]
        super().__init__("\n".join(lines))
