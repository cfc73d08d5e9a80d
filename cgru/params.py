"""Deprecated module path: use ``cgru.core.network`` (or the names in ``cgru``).  Removed in cgru 0.4.0."""
import warnings as _warnings

from cgru.core.network import *  # noqa: F401,F403
from cgru.core.network import Network as Params  # noqa: F401

_warnings.warn("cgru.params is deprecated; use cgru.core.network (or the names exported by cgru)"
               "; it will be removed in cgru 0.4.0",
               DeprecationWarning, stacklevel=2)
