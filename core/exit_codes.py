"""The exit codes of every ``cascade`` command, and how an error becomes one line and a code.

0 success; 1 the answer the command exists to give is no (the gate rejected the candidate,
the rollout rolled back); 2 a usage error (argparse: an unknown option, a bad value, options
that exclude each other); 3 a failure (refused, bad data or config, a file that cannot be
read or written, a store that cannot be reached; an unexpected error too, with its
traceback). A scheduler retries 3, never 2, and 1 is a verdict, not a fault.
"""

from __future__ import annotations

import sys
import traceback

from pydantic import ValidationError

from core.errors import CascadeError, UsageError, WriteError
from core.redact import redact_text

EXIT_OK = 0
EXIT_REJECTED = 1
EXIT_USAGE = 2
EXIT_FAILED = 3

EPILOG = f"""exit codes (every command):
  {EXIT_OK}  success
  {EXIT_REJECTED}  the answer the command exists to give is no: retrain - the gate rejected
     the candidate (registered as rejected); rollout - the canary was rolled back
  {EXIT_USAGE}  usage error: an unknown option, a value out of range or not a finite number,
     options that exclude or need each other (nothing was done)
  {EXIT_FAILED}  failure: refused (a lock is held, the version is not eligible), bad data or
     config file, a path that cannot be read or written, a store that cannot be reached
     (an unexpected error also exits {EXIT_FAILED}, with its traceback)"""


def os_error_line(error: OSError) -> str:
    """``cannot write <path>: <reason>`` (a ``WriteError``), ``cannot access <path>: <reason>``
    (any other OSError naming a path), else the reason alone (a refused connection)."""
    reason = error.strerror or str(error) or type(error).__name__
    if error.filename is None:
        return reason
    paths = [error.filename] + ([error.filename2] if error.filename2 is not None else [])
    verb = "write" if isinstance(error, WriteError) else "access"
    return f"cannot {verb} {' -> '.join(map(str, paths))}: {reason}"


def _store_error() -> tuple[type[Exception], ...]:
    try:
        from redis.exceptions import RedisError
    except ImportError:  # the train-only install has no redis
        return ()
    return (RedisError,)


def fail(error: Exception, prog: str = "cascade") -> int:
    """Print ``<prog>: error: <one line>`` on stderr for ``error`` and return its exit code
    (an unexpected error also prints its traceback: it is a bug)."""
    if isinstance(error, UsageError):
        code, line = EXIT_USAGE, str(error)
    elif isinstance(error, CascadeError | ValidationError):
        code, line = EXIT_FAILED, str(error)
    elif isinstance(error, OSError):
        code, line = EXIT_FAILED, os_error_line(error)
    elif isinstance(error, _store_error()):
        code, line = EXIT_FAILED, f"redis: {error}"
    else:
        print(redact_text("".join(traceback.format_exception(error))), file=sys.stderr, end="")
        code, line = EXIT_FAILED, f"unexpected {type(error).__name__}: {error}"
    print(f"{prog}: error: {redact_text(line)}", file=sys.stderr, flush=True)
    return code
