"""Progress for long operations: a bar on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TextIO


class Progress:
    """``with Progress(total, "items") as bar: bar.update(done)`` — absolute counts."""

    def __init__(
        self,
        total: int,
        label: str,
        *,
        echo: Callable[[str], None] | None = None,
        stream: TextIO | None = None,
        every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """A bar when ``stream`` is a terminal, else a line every ``every_s`` seconds."""
        self.total, self.label, self.done = total, label, 0
        self.stream = stream or sys.stderr
        self.echo = echo or (lambda line: print(line, file=self.stream, flush=True))
        self.every_s, self.clock = every_s, clock
        self._last = clock()
        self._bar: Any = None
        if self.stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit=" " + label.split()[0], file=self.stream)

    def update(self, done: int) -> None:
        """Report that ``done`` units are finished."""
        if self._bar is not None:
            self._bar.update(max(0, done - self.done))
        elif done != self.done and (
            self.clock() - self._last >= self.every_s or done >= self.total
        ):
            self._last = self.clock()
            self.echo(f"   {done}/{self.total} {self.label}")
        self.done = max(self.done, done)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.done < self.total and kind is None:
            self.echo(f"   {self.done}/{self.total} {self.label}")
