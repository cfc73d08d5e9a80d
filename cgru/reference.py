"""Deprecated module path: use ``cgru.core.reference`` (or the names in ``cgru``).  Kept for one release."""
import warnings as _warnings

from cgru.core.reference import *  # noqa: F401,F403

_warnings.warn("cgru.reference is deprecated; use cgru.core.reference (or the names exported by cgru)",
               DeprecationWarning, stacklevel=2)
