"""Deprecated module path: use ``cgru.core.engine`` (or the names in ``cgru``).  Removed in cgru 0.4.0."""
import warnings as _warnings

from cgru.core.engine import *  # noqa: F401,F403

_warnings.warn("cgru.engine is deprecated; use cgru.core.engine (or the names exported by cgru)"
               "; it will be removed in cgru 0.4.0",
               DeprecationWarning, stacklevel=2)
