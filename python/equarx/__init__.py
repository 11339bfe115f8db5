"""equarx: EQuARX quantized collectives for XLA.

Sum all-reduces, reduce-scatters, all-gathers and all-to-alls (bf16 by
default) become block-wise quantized transfers of int8, fp8 or int4 codes
with f32 accumulation: about one byte per element on the wire instead of two,
or half a byte. Per op the pass picks the algorithm (ring, two-shot,
two-level) and whether to Hadamard-rotate the blocks. This package is the
Python door over the Rust library's C ABI.

- :func:`rewrite` rewrites serialized HLO module bytes;
  :func:`format_report` makes its report the CLI's ``--report`` table.
- :mod:`equarx.jax` registers the pass with JAX's compiler in one call::

      import equarx.jax
      equarx.jax.enable()            # JAX's default backend, equarx's defaults
      ...                            # every jit compiled from now on is rewritten
      equarx.jax.print_report()      # what happened to each collective
      equarx.jax.disable()

  or for one block: ``with equarx.jax.enable(...): ...``.

Installed (``pip install .`` from a checkout, or the wheel), the package
carries its own ``libequarx.so`` and the ``equarx`` command. The library is
found, in order, through ``$EQUARX_LIB`` (when set, it wins), next to this
package (the installed one), or in a source checkout's
``target/{release,debug}``; :func:`library_path` says which.
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
from equarx.report import format_report

__all__ = [
    "EquarxError",
    "RewriteResult",
    "check_options",
    "format_report",
    "library_path",
    "op_stats",
    "rewrite",
    "version",
]
