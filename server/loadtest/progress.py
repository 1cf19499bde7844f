"""The progress bar on stderr: the sweep's seconds, phase by phase (a closed loop's pace is set
by the server, so time is what a user can plan with), with the last step's figures beside it.
Off with ``--no-progress`` or when stderr is not a terminal; messages go to stderr either way.
"""

from __future__ import annotations

import sys
import time
from typing import Any


class SweepProgress:
    """A tqdm bar counting seconds of warm-up and measurement over the whole sweep. tqdm is
    imported only when the bar is shown, so ``--no-progress`` works without it."""

    def __init__(self, total_seconds: float, enabled: bool) -> None:
        self._bar: Any = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(
                total=round(total_seconds, 1),
                unit="s",
                file=sys.stderr,
                dynamic_ncols=True,
                leave=False,
                bar_format="{desc} {bar} {n:.0f}/{total:.0f} s [{elapsed}<{remaining}]{postfix}",
            )
        self._base = 0.0
        self._phase_s = 0.0
        self._began = 0.0
        self._done = 0.0  # seconds of the phases already over

    def begin(self, description: str, seconds: float) -> None:
        self._base, self._phase_s, self._began = self._done, seconds, time.monotonic()
        if self._bar is not None:
            self._bar.set_description_str(description, refresh=False)
            self._set(self._base)

    def tick(self) -> None:
        if self._bar is not None:
            self._set(self._base + min(time.monotonic() - self._began, self._phase_s))

    def end(self) -> None:
        """The phase is over: count all its seconds, even when ``--max-requests`` ended it."""
        self._done = self._base + self._phase_s
        if self._bar is not None:
            self._set(self._done)

    def extend(self, seconds: float) -> None:
        """A step is measured again (with more client processes): more seconds to go."""
        if self._bar is not None:
            self._bar.total = round(float(self._bar.total or 0) + seconds, 1)
            self._bar.refresh()

    def show(self, text: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(text)

    def write(self, message: str) -> None:
        """A line on stderr that does not break the bar."""
        if self._bar is not None:
            self._bar.write(message, file=sys.stderr)
        else:
            print(message, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def _set(self, value: float) -> None:
        self._bar.n = round(value, 1)
        self._bar.refresh()
