"""Keep a library from importing optional integrations we never use."""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType


class _Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, names: frozenset[str]) -> None:
        self._names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> None:
        if fullname.partition(".")[0] in self._names:
            raise ModuleNotFoundError(f"{fullname} is not loaded here", name=fullname)
        return None


@contextlib.contextmanager
def without_optional_integrations(*names: str) -> Iterator[None]:
    """While the block runs, importing any of `names` (top-level packages not yet loaded) fails
    as if they were not installed; libraries that treat them as optional then skip them. Once
    the block ends they can be imported as usual."""
    finder = _Refuse(frozenset(n for n in names if n not in sys.modules))
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
