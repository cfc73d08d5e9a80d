"""Where the engine's heavy work runs: a small backend protocol, with the CPU as its one
implementation.

The engine and the cell kinds (``cgru.core.kinds``) ask the backend for everything that
depends on the machine, and for nothing else:

===================  =============================================================================
``empty``            the buffers of a call (outputs; ``plan.empty``, which the tests poison)
``workspace``        a call's temporaries, sized by one function and carved in one place
``gemm``             ``C = op(A)·op(B) + beta·C`` on row-major views (the weight gradients)
``gemm_t``           ``C (+)= Aᵀ·B``, ``A`` given as blocks of columns (a weight gradient whose
                     operand lies in two buffers)
``gemm_packed``      ``C (+)= A·op(B)``, ``op(B)`` packed by ``pack`` (the input projections and
                     the input gradients: rows computed alike however they are grouped)
``with_pack``        this backend for one call: its weight gradients' packs in the call's workspace
``pack``             weights packed for the kernels' GEMM (``weights`` keeps them)
``kernels(kind)``    a cell kind's compiled time loops: ``forward_layer``, ``backward_layer``,
                     ``Direction``
===================  =============================================================================

A GPU backend would be a second object with these names (its buffers device arrays, its
kernels CUDA): the engine would not change.
"""
import importlib

from cgru.core import plan, weights

__all__ = ["CPU", "BACKEND", "release_memory"]


class CPU:
    """cgru's CPU backend: NumPy buffers from cgru's pool, the kernels' packed GEMM and SciPy's
    BLAS for the whole-sequence products (as blocks on cgru's threads), the Cython kernels."""

    name = "cpu"

    def __init__(self):
        self._kernels = {}          # kind name -> its compiled module

    @staticmethod
    def empty(shape, dtype):
        """``plan.empty`` as it is at the call (looked up each time, so that replacing it, as
        the tests' poisoning does, reaches every buffer)."""
        return plan.empty(shape, dtype)

    workspace = staticmethod(plan.Workspace)
    gemm = staticmethod(plan.gemm)
    gemm_t = staticmethod(plan.gemm_t)
    gemm_packed = staticmethod(plan.gemm_packed)

    def with_pack(self, pack):
        """This backend for one call whose workspace holds ``pack``: its ``gemm`` packs a
        weight gradient's right operand there (``plan.gemm_pack_size``)."""
        return _CallBackend(self, pack)

    pack = staticmethod(weights.pack_rhs)

    def kernels(self, kind):
        """``kind``'s compiled module (``kind.kernel_module``), imported on first use."""
        module = self._kernels.get(kind.name)
        if module is None:
            module = importlib.import_module(kind.kernel_module)
            self._kernels[kind.name] = module
        return module


class _CallBackend:
    """A backend bound to one call's workspace (``CPU.with_pack``)."""

    def __init__(self, backend, pack):
        self._backend, self._pack = backend, pack

    def gemm(self, ta, tb, A, B, C, beta=0.0, nt=1):
        self._backend.gemm(ta, tb, A, B, C, beta, nt, pack=self._pack)

    def gemm_t(self, As, B, C, beta=0.0, nt=1):
        self._backend.gemm_t(As, B, C, beta, nt, pack=self._pack)

    def __getattr__(self, name):
        return getattr(self._backend, name)


BACKEND = CPU()


def release_memory():
    """Drop the pool's idle blocks and the kept copies of the weights with their packs (the
    memory returns to the allocator once nothing refers to them)."""
    plan.release_pool()
    weights.release()
