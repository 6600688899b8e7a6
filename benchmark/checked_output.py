"""Output that is checked, for the benchmark's Python programs (bench.py, report.py), as
cpp/checked_output.hpp is for its C++ ones: a program whose standard output does not take what
it printed (a full disk, /dev/full, a closed pipe) says so and exits 1, never 0, and never with
a traceback.
"""
import os
import sys


class StdoutFailed(Exception):
    """Standard output refused a write. Not an OSError, so that a program's own handlers for
    errors about its files do not take it for one of theirs."""


class _Checked:
    """Standard output whose failures are `StdoutFailed`."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text):
        try:
            return self._stream.write(text)
        except OSError as e:
            raise StdoutFailed(e.strerror or "write error") from e

    def flush(self):
        try:
            self._stream.flush()
        except OSError as e:
            raise StdoutFailed(e.strerror or "write error") from e

    def __getattr__(self, name):
        return getattr(self._stream, name)


def run(main, argv, program):
    """Exits with `main(argv)`'s status, or 1 when standard output failed."""
    sys.stdout = _Checked(sys.stdout)
    try:
        status = main(argv)
        sys.stdout.flush()
    except StdoutFailed as e:
        print(f"{program}: cannot write to standard output: {e}", file=sys.stderr)
        # Drop what could not be written, so that Python's exit does not try again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.__stdout__.fileno())
        status = 1
    sys.exit(status)
