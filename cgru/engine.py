"""Deprecated module path: use ``cgru.core.engine`` (or the names in ``cgru``).  Kept for one release."""
import warnings as _warnings

from cgru.core.engine import *  # noqa: F401,F403

_warnings.warn("cgru.engine is deprecated; use cgru.core.engine (or the names exported by cgru)",
               DeprecationWarning, stacklevel=2)
