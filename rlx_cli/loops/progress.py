"""Progress bars on a terminal, a line per milestone elsewhere (CI logs, pipes, sweeps)."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager


class Progress:
    """``silent``: nothing at all (the processes of a torchrun job other than rank 0)."""

    def __init__(self, *, quiet: bool | None = None, silent: bool = False):
        self.interactive = sys.stderr.isatty() if quiet is None else not quiet
        self.silent = silent

    @contextmanager
    def task(self, description: str, total: int):
        """Yields ``advance(**fields)``: one step done, with the fields shown beside the bar."""
        if self.silent:
            yield lambda **fields: None
            return
        if not self.interactive:
            start = time.perf_counter()
            print(f"{description} ...", file=sys.stderr, flush=True)
            yield lambda **fields: None
            print(f"{description}: done in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
            return
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
        )
        with RichProgress(*columns, transient=False) as bar:
            handle = bar.add_task(description, total=total, info="")

            def advance(**fields):
                info = "  ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in fields.items())
                bar.update(handle, advance=1, info=info)

            yield advance

    def note(self, message: str) -> None:
        if not self.silent:
            print(message, file=sys.stderr, flush=True)
