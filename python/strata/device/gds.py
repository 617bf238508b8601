"""Whether kvikio reads a file through cuFile (GPUDirect Storage: the disk's DMA lands in device
memory) or in its compatibility mode (POSIX reads through host memory), and why: what the
device paths ask before they read anything straight into device memory."""

from __future__ import annotations

import importlib
import types


def compat_mode_reason(kvikio, handle=None) -> str | None:
    """Why kvikio would read ``handle`` (a ``kvikio.CuFile``, or None: any file) through POSIX
    and host memory, or None when it reads through cuFile. Asks the file handle where kvikio
    can (the file system's answer), else the library: ``defaults.is_compat_mode_preferred()``
    (kvikio 25.04 on, with ``AUTO`` resolved), else the older ``defaults.compat_mode()`` (a
    bool, later an enum)."""
    on = "KVIKIO_COMPAT_MODE is on, or libcufile did not load"
    preferred = getattr(handle, "is_compat_mode_preferred", None)
    if callable(preferred):
        return "cuFile cannot serve this file or its file system" if preferred() else None
    defaults = _defaults(kvikio)
    preferred = getattr(defaults, "is_compat_mode_preferred", None)
    if callable(preferred):
        return on if preferred() else None
    legacy = getattr(defaults, "compat_mode", None)
    if callable(legacy):
        mode = legacy()
        return on if mode is True or getattr(mode, "name", None) == "ON" else None
    return "this kvikio does not say whether it reads through cuFile"


def _defaults(kvikio):
    """kvikio's ``defaults`` module: an attribute of the package before 26.10, a submodule that
    ``import kvikio`` no longer imports since (None when neither)."""
    defaults = getattr(kvikio, "defaults", None)
    if defaults is None and isinstance(kvikio, types.ModuleType):
        try:
            defaults = importlib.import_module(f"{kvikio.__name__}.defaults")
        except ImportError:
            return None
    return defaults
