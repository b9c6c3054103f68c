"""Errors that name the ranks they came from, raised where the user called `run`."""

from __future__ import annotations


class RankFailure(RuntimeError):
    """One or more ranks raised. `failures` maps each failed rank to its traceback text;
    `exceptions` to the exception object where it could be brought back."""

    def __init__(self, failures: dict[int, str], exceptions: dict[int, BaseException] | None = None,
                 headline: str | None = None):
        self.failures = dict(sorted(failures.items()))
        self.exceptions = exceptions or {}
        self.ranks = list(self.failures)
        ranks = ", ".join(str(r) for r in self.ranks)
        head = headline or f"rank{'s' if len(self.ranks) > 1 else ''} {ranks} failed"
        body = "\n".join(f"--- rank {r} ---\n{tb.rstrip()}" for r, tb in self.failures.items())
        super().__init__(f"{head}\n{body}")


class RankTimeout(RankFailure):
    """Some ranks did not finish within the call's timeout. `ranks` are the ones that hung;
    `failures` also holds what the finished ranks raised, if anything."""

    def __init__(self, hung: list[int], timeout: float, failures: dict[int, str] | None = None,
                 exceptions: dict[int, BaseException] | None = None):
        self.hung = sorted(hung)
        names = ", ".join(str(r) for r in self.hung)
        msgs = {r: f"did not finish within {timeout:g} s" for r in self.hung}
        msgs.update(failures or {})
        super().__init__(msgs, exceptions, headline=(
            f"rank{'s' if len(self.hung) > 1 else ''} {names} did not finish within {timeout:g} s "
            f"(a deadlock, a collective not called by every rank, or an endless loop)"))
        self.ranks = self.hung
