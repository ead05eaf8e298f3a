"""Child processes for the suite's real-process tests."""

import subprocess
import sys
import textwrap


def python(code, *args, **kwargs):
    """Start ``code`` (dedented) in a new Python process of this venv."""
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def finish(proc, timeout=60):
    """Wait for ``proc``; its (stdout, stderr), failing the test with its
    stderr when it did not exit 0."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child exited {proc.returncode}:\n{err}"
    return out, err


def wait_for_line(proc, expected, timeout=30):
    """Read ``proc``'s stdout until a line equal to ``expected``."""
    import selectors
    import time

    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not sel.select(timeout=deadline - time.monotonic()):
            break
        line = proc.stdout.readline()
        if line == "":
            break
        if line.strip() == expected:
            return
    proc.kill()
    raise AssertionError(f"the child never printed {expected!r}: {proc.stderr.read()}")
