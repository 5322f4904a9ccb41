"""Hooks run on a module right after it is first imported: what a rank adjusts or times in a library only once
the code imports it (jdist imports none of them itself: ``torch.distributed.pipelining`` alone takes 0.7 s).

Example:
    >>> import sys, types
    >>> seen = []
    >>> undo = after_import("json", lambda module: seen.append(module.__name__))  # imported already: at once
    >>> seen, undo()
    (['json'], None)
"""

from __future__ import annotations

import importlib.abc
import sys
from typing import Any, Callable


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs a hook on a module right after it is first imported (the other finders find it)."""

    def __init__(self, hooks: dict[str, Callable[[Any], None]]):
        self.hooks = hooks

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        hook = self.hooks.get(fullname)
        if hook is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                exec_module = spec.loader.exec_module

                def run_then_hook(module: Any) -> None:
                    exec_module(module)
                    hook(module)

                spec.loader.exec_module = run_then_hook  # this spec's own loader
                return spec
        return None


def after_import(name: str, hook: Callable[[Any], None]) -> Callable[[], None]:
    """Run ``hook(module)`` now if ``name`` is imported, else right after its first import; returns the
    remover of a hook not run yet."""
    if name in sys.modules:
        hook(sys.modules[name])
        return lambda: None
    finder = AfterImport({name: hook})
    sys.meta_path.insert(0, finder)

    def remove() -> None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

    return remove


__all__ = ["AfterImport", "after_import"]
