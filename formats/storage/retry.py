"""How hard to try before a storage error is final."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import MissingObjectError, StorageError

__all__ = ["Retry"]

T = TypeVar("T")


# Errors that no retry mends (pyarrow names S3's error codes in its messages).
_PERMANENT = ("NO_SUCH_BUCKET", "ACCESS_DENIED", "INVALID_ACCESS_KEY_ID",
              "SIGNATURE_DOES_NOT_MATCH")


@dataclass(frozen=True)
class Retry:
    """How hard to try before a storage error is final.

    Args:
        attempts: tries in all (the first one included).
        backoff: seconds before the second try; doubled each time, with jitter.
        max_backoff: the longest single wait.
    """

    attempts: int = 5
    backoff: float = 0.2
    max_backoff: float = 10.0

    def run(self, uri: str, what: str, fn: Callable[[], T]) -> T:
        delay = self.backoff
        for attempt in range(1, self.attempts + 1):
            try:
                return fn()
            except FileNotFoundError:
                raise MissingObjectError(f"{what}: no such object", path=uri) from None
            except OSError as exc:
                if isinstance(exc, PermissionError) or any(c in str(exc) for c in _PERMANENT):
                    raise StorageError(f"{what} failed ({exc})", path=uri) from exc
                if attempt == self.attempts:
                    raise StorageError(f"{what} failed after {attempt} tries ({exc})",
                                       path=uri) from exc
            time.sleep(min(delay, self.max_backoff) * (0.5 + random.random()))
            delay *= 2
        raise AssertionError("unreachable")
