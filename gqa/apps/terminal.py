"""Terminal helpers of gqa's commands: a progress bar on stderr, plain-text tables, times and
byte counts, and the command-line vocabulary they share (integer lists, ``MODE@L`` names)."""
import argparse
import math
import sys
import time


class Progress:
    """A progress bar on stderr (or `stream`), drawn only when enabled, at most ten times a
    second, with the elapsed time and an estimate of the time left."""

    def __init__(self, total, enabled, stream=None):
        self.total, self.done, self.enabled = max(1, total), 0, enabled
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self._last = 0.0

    def update(self, n=1, label=""):
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self._last < 0.1 and self.done < self.total:
            return
        self._last = now
        frac = min(1.0, self.done / self.total)
        width = 30
        fill = int(frac * width)
        el = now - self.t0
        eta = el / frac - el if frac > 0 else 0
        self.stream.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {100 * frac:5.1f}% "
                          f"{el:6.1f}s elapsed, ~{eta:5.0f}s left  {label[:40]:<40}")
        self.stream.flush()

    def close(self):
        if self.enabled:
            self.stream.write("\r" + " " * 110 + "\r")
            self.stream.flush()


def format_table(head, rows, left=0):
    """A plain-text table: column `left` left-aligned, the others right-aligned."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *rows)]

    def line(cells):
        return "  ".join(c.ljust(w) if i == left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(head), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def format_bytes(n):
    """n bytes as MiB / KiB (two decimals) or B."""
    for unit, k in (("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= k:
            return f"{n / k:.2f} {unit}"
    return f"{n} B"


def format_time(us):
    """A time in microseconds as us / ms / s ('-' for None)."""
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.1f}us"
    if us < 1e6:
        return f"{us / 1e3:.2f}ms"
    return f"{us / 1e6:.2f}s"


def int_list(s):
    """A command-line list of integers, ``"0,4"`` -> ``[0, 4]``."""
    try:
        return [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers separated by commas, got {s!r}") from None


def at_least(minimum):
    """argparse type: an integer >= minimum (a count, a length, a thread number)."""
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {s!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}")
        return v
    parse.__name__ = f"integer >= {minimum}"
    return parse


def list_at_least(minimum):
    """argparse type: a non-empty comma list of integers, each >= minimum."""
    def parse(s):
        values = int_list(s)
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"expected integers >= {minimum} separated by commas, got {s!r}")
        return values
    parse.__name__ = f"list of integers >= {minimum}"
    return parse


def real_at_least(minimum, strict=False):
    """argparse type: a finite number >= minimum (> minimum with strict)."""
    def parse(s):
        try:
            v = float(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {s!r}") from None
        if not math.isfinite(v) or v < minimum or (strict and v == minimum):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {minimum}, got {s}")
        return v
    parse.__name__ = f"number {'>' if strict else '>='} {minimum}"
    return parse


def accuracy_levels(values, command):
    """``--accuracy-levels``: 0 and the values, sorted; a level the library refuses (its own
    check, gqa.config) is a SystemExit naming the command, the option and why."""
    import gqa
    for level in values:
        try:
            with gqa.config(accuracy_level=level):
                pass
        except (TypeError, ValueError) as e:
            raise SystemExit(f"gqa {command}: --accuracy-levels: {e}")
    return sorted(set(values) | {0})


def leveled(mode, level):
    """The name of a cache mode run at an accuracy level: the mode at 0, ``mode@L`` else."""
    return mode if not level else f"{mode}@{level}"
