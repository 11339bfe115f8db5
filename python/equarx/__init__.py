"""equarx: EQuARX quantized all-reduce for XLA.

Sum all-reduces (bf16 by default) become a ring of int8 collective-permutes
with block-wise quantization: about one byte per element on the wire instead
of two. This package is the Python door over the Rust library's C ABI.

- :func:`rewrite` rewrites serialized HLO module bytes.
- :mod:`equarx.jax` registers the pass with JAX's compiler in one call::

      import equarx.jax
      equarx.jax.enable(platforms=("tpu",), min_payload=1 << 20)
      ...                      # every jit compiled from now on is rewritten
      equarx.jax.last_report() # what happened to each all-reduce
      equarx.jax.disable()

The shared library is found through ``$EQUARX_LIB``, next to this package, or
in a source checkout's ``target/{release,debug}``.
"""

from equarx._native import (
    EquarxError,
    RewriteResult,
    check_options,
    library_path,
    rewrite,
    version,
)

__all__ = [
    "EquarxError",
    "RewriteResult",
    "check_options",
    "library_path",
    "rewrite",
    "version",
]
