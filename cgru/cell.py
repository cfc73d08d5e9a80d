"""Deprecated module path: use ``cgru.core.cells`` (or the names in ``cgru``).  Kept for one release."""
import warnings as _warnings

from cgru.core.cells import *  # noqa: F401,F403

_warnings.warn("cgru.cell is deprecated; use cgru.core.cells (or the names exported by cgru)",
               DeprecationWarning, stacklevel=2)
