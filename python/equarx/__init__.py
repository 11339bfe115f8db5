"""equarx: EQuARX quantized collectives for XLA.

Sum all-reduces, reduce-scatters, all-gathers and all-to-alls (bf16 by
default) become block-wise quantized transfers of int8, fp8 or int4 codes
with f32 accumulation: about one byte per element on the wire instead of two,
or half a byte. Per op the pass picks the algorithm (ring, two-shot,
two-level) and whether to Hadamard-rotate the blocks. This package is the
Python door over the Rust library's C ABI.

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
    op_stats,
    rewrite,
    version,
)

__all__ = [
    "EquarxError",
    "RewriteResult",
    "check_options",
    "library_path",
    "op_stats",
    "rewrite",
    "version",
]
