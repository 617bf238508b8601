"""Progress bars for long jobs, fed by the native callback ``(event, *args)``.

On a terminal the bar redraws in place at most ten times a second; elsewhere (CI logs, pipes)
it prints a line every ``log_every`` seconds and one when each stage ends, so long jobs still
show they are alive.
"""

from __future__ import annotations

import sys
import time
from typing import ClassVar, TextIO

from .units import fmt_count, fmt_duration, fmt_rate_mb


class ProgressBar:
    """Callable progress sink: ``("stage", name, total_bytes, total_rows)``,
    ``("update", rows, bytes)``, ``("message", text)`` and ``("detail", text)`` (figures shown
    beside the bar until the stage ends)."""

    #: What the rows of a stage are, by the stage name's first word (default: rows).
    UNITS: ClassVar[dict[str, str]] = {"epoch": "edges", "eval": "queries", "train": "seeds"}

    def __init__(self, stream: TextIO | None = None, *, enabled: bool = True, log_every: float = 10.0, width: int = 24):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.log_every = log_every
        self.width = width
        self._stage: str | None = None
        self._total_bytes = self._total_rows = 0
        self._rows = self._bytes = 0
        self._detail = ""
        self._start = self._last_draw = 0.0
        self.stages: list[tuple[str, float, int, int]] = []

    def __call__(self, event: str, *args) -> bool:
        if event == "stage":
            self._end_stage()
            self._stage, self._total_bytes, self._total_rows = args
            self._rows = self._bytes = 0
            self._detail = ""
            self._start = self._last_draw = time.monotonic()
        elif event == "update":
            self._rows, self._bytes = args
            now = time.monotonic()
            if self.tty and now - self._last_draw >= 0.1:
                self._draw(final=False)
                self._last_draw = now
            elif not self.tty and now - self._last_draw >= self.log_every:
                self._draw(final=False)
                self._last_draw = now
        elif event == "message":
            self.message(args[0])
        elif event == "detail":
            self._detail = args[0]
        return True

    def message(self, text: str) -> None:
        """Prints a line (a plan, a warning) without breaking the bar."""
        if not self.enabled:
            return
        if self.tty and self._stage:
            self.stream.write("\r\033[K")
        self.stream.write(f"  {text}\n")
        self.stream.flush()

    def close(self) -> None:
        """Ends the current stage's line."""
        self._end_stage()

    def _end_stage(self) -> None:
        if self._stage is None:
            return
        elapsed = time.monotonic() - self._start
        self.stages.append((self._stage, elapsed, self._rows, self._bytes))
        self._draw(final=True)
        self._stage = None

    def _line(self, final: bool) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        total, done = (self._total_bytes, self._bytes) if self._total_bytes else (self._total_rows, self._rows)
        parts = [f"{self._stage:<16}"]
        if total and not final:
            frac = min(done / total, 1.0)
            fill = int(frac * self.width)
            parts.append("[" + "#" * fill + "." * (self.width - fill) + f"] {frac * 100:3.0f}%")
        if self._rows:
            unit = self.UNITS.get(self._stage.split(" ", 1)[0], "rows")
            parts.append(f"{fmt_count(self._rows)} {unit}  {fmt_count(self._rows / elapsed)} {unit}/s")
        if self._bytes:
            parts.append(fmt_rate_mb(self._bytes, elapsed))
        if self._detail:
            parts.append(self._detail)
        if final:
            parts.append(f"done in {fmt_duration(elapsed)}")
        elif total and done:
            parts.append(f"ETA {fmt_duration(elapsed * (total - done) / done)}")
        return "  ".join(parts)

    def _draw(self, final: bool) -> None:
        if not self.enabled:
            return
        line = self._line(final)
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
