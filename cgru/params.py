"""Deprecated module path: use ``cgru.core.network`` (or the names in ``cgru``).  Kept for one release."""
import warnings as _warnings

from cgru.core.network import *  # noqa: F401,F403

_warnings.warn("cgru.params is deprecated; use cgru.core.network (or the names exported by cgru)",
               DeprecationWarning, stacklevel=2)
