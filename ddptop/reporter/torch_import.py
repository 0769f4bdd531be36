"""Run a callback right after a module finishes importing (a post-import hook).

``sitecustomize`` runs before the training script imports torch; importing torch
ourselves would slow every Python process the job starts. Instead a meta-path finder
wraps the module's loader and calls back once ``torch/__init__`` has executed, before
the script gets to construct a DataLoader or DDP.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Callback = Callable[[ModuleType], None]


def when_imported(name: str, callback: Callback) -> None:
    """Call *callback(module)* now if *name* is imported, else right after its import."""
    module = sys.modules.get(name)
    if module is not None and not _initialising(module):
        _safe(callback, module)
        return
    sys.meta_path.insert(0, _PostImportFinder(name, callback))


def _initialising(module: ModuleType) -> bool:
    spec = getattr(module, "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _safe(callback: Callback, module: ModuleType) -> None:
    try:
        callback(module)
    except Exception as exc:  # patches are best effort; training goes on without them
        print(f"ddptop: could not hook {module.__name__}: {exc}", file=sys.stderr)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, callback: Callback) -> None:
        self.name = name
        self.callback = callback
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or getattr(self._busy, "active", False):
            return None
        self._busy.active = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        finally:
            self._busy.active = False
        if spec is None or spec.loader is None:
            return None
        spec.loader = _NotifyingLoader(spec.loader, self)
        return spec


class _NotifyingLoader(importlib.abc.Loader):
    def __init__(self, inner: Any, finder: _PostImportFinder) -> None:
        self.inner = inner
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        # The module must look like its real loader loaded it (torch reads __loader__).
        module.__loader__ = self.inner
        if module.__spec__ is not None:
            module.__spec__.loader = self.inner
        self.inner.exec_module(module)
        try:
            sys.meta_path.remove(self.finder)
        except ValueError:
            pass
        _safe(self.finder.callback, module)
