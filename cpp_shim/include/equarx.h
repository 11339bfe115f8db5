/* equarx.h — the C ABI of equarx (libequarx.so / libequarx.a).
 *
 * equarx rewrites the sum all-reduces of an XLA HLO module into a ring of
 * int8 collective-permutes with block-wise quantization (EQuARX). This header
 * is the door for C, Python (ctypes) and anything else that can call C.
 *
 * Rules:
 *  - Every pointer and length is checked: a null where a value is needed is
 *    EQUARX_INVALID_ARGUMENT, never a crash. No panic or exception crosses
 *    this boundary (a bug inside equarx is EQUARX_INTERNAL + a message).
 *  - No global state (except the options of the PJRT callback): calls from
 *    many threads at once are independent.
 *  - Memory equarx hands out is freed with the matching equarx_free_*.
 *
 * Options are one JSON object (NULL or "" for all defaults). Absent keys
 * keep their defaults; unknown keys are an error.
 *
 * A value may be JSON (64, true, ["bf16", "f32"]; null leaves
 * min_payload_bytes or a count unset) or text as on equarx's command line
 * ("64", "true", "bf16,f32", "1MiB"). The options (name, value, default,
 * what it does):
 *
 * BEGIN options: made from core/src/options/schema.rs by
 * `EQUARX_BLESS=1 cargo test --test options`; edit there
 *   block_size  B (default: 64):
 *       Elements per quantization block (B): one scale per block.
 *   scale_type  f32|bf16 (default: bf16):
 *       Type of the per-block scales on the wire.
 *   pipeline_depth  D (default: 1):
 *       Independent sub-chunk chains per ring direction (D).
 *   bidirectional  true|false (default: true):
 *       Send half of every chunk each way round the ring (false: one way,
 *       half the messages, half the link use).
 *   min_payload_bytes  BYTES (default: the cost model decides):
 *       Rewrite only all-reduces of at least this many bytes (in their own
 *       type) instead of asking the cost model; 0 rewrites every eligible
 *       all-reduce.
 *   topology  TOPOLOGY (default: v5e; h100 where XLA:GPU compiles):
 *       The machine the cost model predicts for: v5e, v6e, v5p, h100, h200,
 *       optionally with a slice shape (v5e:4x4; a slice smaller than the
 *       torus has no wraparound). Unset: h100 where XLA:GPU compiles the
 *       rewrite (--platform gpu, XLA:GPU's hook, enable() on a GPU), else
 *       v5e. The figures are a model.
 *   types  TYPE,... (default: bf16):
 *       Element types to quantize (bf16, f16, f32). XLA:CPU promotes bf16
 *       all-reduces to f32 before scheduling: use bf16,f32 there.
 *   gather  all-gather|permute (default: all-gather):
 *       How the reduced chunks reach every rank: one all-gather, or P-1
 *       collective-permute hops round the same ring.
 *   fuse  auto|off (default: auto):
 *       Outline the emitted quantize / dequantize chains into loop fusions:
 *       auto does when the module is past XLA's fusion (--stage fused, or
 *       detected: a dump after optimizations, XLA:CPU's pre-scheduler hook;
 *       --stage tiled, XLA:TPU's, with only what libtpu's fusion emitter
 *       takes), never before; off never does.
 *   stage  auto|pre-fusion|fused|tiled (default: auto):
 *       Where in XLA's pipeline the module is: pre-fusion (after SPMD
 *       partitioning, before fusion: a lowered module, XLA:GPU's
 *       pre-scheduler hook), fused (after XLA's fusion: XLA:CPU's hook) or
 *       tiled (after a backend's tiling assignment: XLA:TPU's hook, where
 *       equarx tiles what it emits, outlines only the fusions libtpu's
 *       emitter takes and emits the rotation's product as libtpu's fused
 *       convolution); auto: tiled when a layout has tiles or a memory space,
 *       else fused when the module holds a fusion. It sets the forms the
 *       rewrite emits (the all-to-all's, the loop's copies, and whether
 *       --fuse auto outlines loop fusions); the report names it.
 *   platform  auto|cpu|gpu|tpu (default: auto):
 *       The XLA backend that compiles the rewrite: cpu, gpu or tpu. The pass
 *       emits the same arithmetic in the form that compiler takes best (a
 *       message as one array for XLA:CPU and XLA:GPU; codes and scales apart
 *       for XLA:TPU, but where an all-to-all takes one array per peer: past
 *       XLA's fusion; before XLA:TPU's fusion the results leave through an
 *       opt-barrier, a boundary as the collective's was); auto: tpu past a
 *       tiling assignment (--stage tiled), cpu past fusion (--stage fused),
 *       else the --topology's (v5e, v6e, v5p: tpu; h100, h200: gpu). The JAX
 *       door before XLA passes the platform it lowered for.
 *   kernels  auto|hlo|mosaic|triton (default: auto):
 *       Who writes the kernels of a rewrite's compute steps: hlo (the pass
 *       emits HLO ops and the compiler fuses them), mosaic (XLA:TPU, before
 *       XLA or at its hook) or triton (XLA:GPU, before XLA or at its hook,
 *       which is before its fusion): the pass writes two-shot's quantize,
 *       dequantize-sum-requantize and dequantize, its reduce-scatter's
 *       quantize and dequantize-sum, and an all-gather's quantize and
 *       dequantize, as one kernel each; int8, B = 64, bf16 scales. mosaic
 *       takes an operand whose last dimension is a multiple of 128 up to 4096
 *       or of 512 and whose rows are a multiple of 128·P, P <= 8 (an
 *       all-gather: 128 rows a rank, any P), scattered or gathered whole
 *       rows, at the hook laid out as libtpu lays it out; triton an operand
 *       of a multiple of 1024·P elements, under 2^31, P <= 16 (an
 *       all-gather: 1024 elements a rank, any P), scattered or gathered whole
 *       runs. auto (the default): on XLA:TPU mosaic and on XLA:GPU triton
 *       where the kernels take the op and the time model predicts them faster
 *       than the hlo plan, hlo otherwise and on XLA:CPU. An op the kernels
 *       cannot take keeps hlo, and the report says why; a forced ring or
 *       two-level keeps the all-reduces and reduce-scatters in hlo, not the
 *       all-gathers, which have no algorithm.
 *   quant_format  int8|fp8-e4m3|fp8-e5m2|int4 (default: int8):
 *       What a code is: int8 (absmax/127), fp8-e4m3 or fp8-e5m2 (absmax/448
 *       or /57344, the float's own rounding), int4 (absmax/7, two codes per
 *       byte; opt-in).
 *   algorithm  auto|ring|two-shot|two-level (default: auto):
 *       The reduce algorithm: ring (P-1 requantizing hops; a torus ring),
 *       two-shot (quantize once, one all-to-all, the owner sums in f32;
 *       switched fabrics), two-level (a ring per axis of a 2-D slice); auto
 *       lets the time model choose per op.
 *   rotation  auto|none|hadamard (default: auto):
 *       Rotate every block by an orthonormal Hadamard transform before
 *       quantizing (undone once at the end): an outlier's energy spreads over
 *       its block. auto: plans with and without it are weighed, and the
 *       rotation stays where its plan comes within 5 % of the fastest and
 *       predicts the lower error.
 *   unroll  true|false (default: false):
 *       Write every ring step out instead of a while loop over the steps: the
 *       rewrite then grows with P and the lanes, and XLA compiles it many
 *       times slower.
 *   max_error  PCT (default: none):
 *       An error budget: the fastest configuration whose predicted relative
 *       RMS error (percent per op, on the op's data as far as it is known: a
 *       profile, or the prior) is at most this; an op with none is skipped
 *       with the reason.
 *   profile  FILE (default: none):
 *       A calibration profile (equarx.jax.calibrate, or equarx calibrate on
 *       saved inputs), as a file or its JSON: the error model predicts each
 *       op it holds from that op's measured inputs, and the others from the
 *       prior; the report says which.
 *   replica_count  N (default: from the module):
 *       Replicas the module runs with; overrides what the module says.
 *   num_partitions  N (default: from the module):
 *       Partitions the module runs with; overrides what the module says.
 *   disabled_passes  PASS,... (default: none):
 *       Passes to skip, by name: quantize-collectives (also by its old name,
 *       quantized-all-reduce), remove-dead-widenings, outline-fusions; an
 *       unknown name is an error when the pipeline runs.
 * END options
 *
 * Example:
 *
 *   equarx_result r = {sizeof(equarx_result)};
 *   equarx_status s = equarx_rewrite(bytes, len,
 *       "{\"min_payload_bytes\": 0, \"types\": [\"bf16\", \"f32\"]}", &r);
 *   if (s != EQUARX_OK) fprintf(stderr, "equarx: %s\n", r.error);
 *   else if (r.changed) use(r.module, r.module_len);   // else keep `bytes`
 *   equarx_free_result(&r);
 */
#ifndef EQUARX_H_
#define EQUARX_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum equarx_status {
  EQUARX_OK = 0,
  EQUARX_INVALID_ARGUMENT = 1, /* null pointer, bad length, bad struct_size */
  EQUARX_INVALID_OPTIONS = 2,  /* options JSON malformed or out of range */
  EQUARX_INVALID_MODULE = 3,   /* the bytes are not a module equarx reads */
  EQUARX_REWRITE_FAILED = 4,   /* the module is malformed, or the pass failed */
  EQUARX_INTERNAL = 5          /* a bug in equarx (caught panic) */
} equarx_status;

/* Filled by equarx_rewrite. Set struct_size = sizeof(equarx_result) before
 * the call; the other fields are outputs. */
typedef struct equarx_result {
  size_t struct_size;
  /* The rewritten module, in the input's container (bare HloModuleProto in,
   * bare HloModuleProto out). NULL when unchanged (keep your input) or on
   * error. */
  uint8_t* module;
  size_t module_len;
  int changed; /* 1 if any all-reduce was rewritten */
  /* NUL-terminated JSON array, one object per all-reduce: name, decision
   * ("rewritten": true/false), reason, group size, mode, wire bytes before
   * and after, predicted error. Set whenever the status is EQUARX_OK. */
  char* report_json;
  /* NUL-terminated message; set whenever the status is not EQUARX_OK. */
  char* error;
} equarx_result;

/* The library version ("0.1.0"), static storage. */
const char* equarx_version(void);

/* Rewrites `module_len` bytes at `module`: a serialized HloModuleProto (as
 * HloModule::ToProto, JAX and the PJRT transform hook give it), or an
 * HloProto / HloModuleProtoWithConfig, gzip-compressed or not. */
equarx_status equarx_rewrite(const uint8_t* module, size_t module_len,
                             const char* options_json, equarx_result* result);

/* Frees the buffers in `result` and nulls them. NULL, a zeroed struct and
 * an already freed one are fine. */
void equarx_free_result(equarx_result* result);

/* Validates options without a module. On failure *error (if error != NULL)
 * receives a message to free with equarx_free_string. */
equarx_status equarx_check_options(const char* options_json, char** error);

/* The error model's statistics of one collective's inputs, for a
 * calibration profile: `inputs` holds `devices` rows of `elements` floats
 * (device d's payload in row d, in rank order); `moved` is nonzero for a
 * collective that moves its inputs (all-gather, all-to-all) rather than
 * summing them; `source` (may be NULL) names where they came from. On
 * success *stats_json receives the statistics as JSON (free it with
 * equarx_free_string); on failure *error (if error != NULL) a message. */
equarx_status equarx_op_stats(const float* inputs, size_t devices, size_t elements,
                              int moved, const char* source, char** stats_json,
                              char** error);

/* The module's collectives as calibration sees them: on success
 * *sites_json receives a JSON array, one object per collective the pass
 * looks at (its profile key, instruction and computation names, whether it
 * is in the entry computation, the collective, "summed" or "moved" inputs,
 * elements per device, and its groups: {"Ok": {space, ids, groups}} or
 * {"Err": reason}). Counts in options_json (or NULL) override the
 * module's. */
equarx_status equarx_sites(const uint8_t* module, size_t len, const char* options_json,
                           char** sites_json, char** error);

/* The calibration profile of what a run measured: measurements_json is
 * {"source": ..., "ops": [{"key": <a site's key>, "stats": [<equarx_op_stats
 * output per group and run>...], "nonfinite_fraction": f}], "unmeasured":
 * [{"key": ..., "reason": ...}]}; *profile_json receives the profile (each
 * op's statistics averaged), the JSON the `profile` option reads. */
equarx_status equarx_profile(const char* measurements_json, char** profile_json,
                             char** error);

/* Frees a string returned through a `char** error`, `char** stats_json`,
 * `char** sites_json` or `char** profile_json` argument. NULL is fine. */
void equarx_free_string(char* s);

/* ---- Experimental: the PJRT XLA-transform extension --------------------
 *
 * A native callback in the shape of the extension in openxla/xla
 * (xla/pjrt/c/pjrt_c_api_xla_transform_extension.h, version 1), so a
 * framework can register equarx with a PJRT plugin (TPU, GPU) without a
 * Python callback (which needs the GIL on the compiler thread and can
 * deadlock ahead-of-time compiles). The extension is new; its layout may
 * change. The struct types are XLA's; include XLA's header to use them.
 *
 * The options are process-wide (the callbacks table carries no user data):
 * set them with equarx_pjrt_configure or equarx_pjrt_register. */
struct PJRT_XlaTransform_Callbacks;
struct PJRT_XlaTransform_Args;

/* The extension's transform_hlo_module. Output buffers stay valid until XLA
 * calls args->header.cleanup_fn(args->header.data). */
void equarx_pjrt_transform_hlo_module(
    struct PJRT_XlaTransform_Callbacks* callbacks,
    struct PJRT_XlaTransform_Args* args);

/* A static callbacks table {version 1, no dtor,
 * equarx_pjrt_transform_hlo_module}. */
struct PJRT_XlaTransform_Callbacks* equarx_pjrt_callbacks(void);

/* Sets the options the callback uses (JSON as for equarx_rewrite). */
equarx_status equarx_pjrt_configure(const char* options_json, char** error);

/* The report of the callback's last call in this process, in
 * *report_json: the JSON array equarx_rewrite gives, or {"error": MESSAGE}
 * when that call failed; NULL before any call. Free it with
 * equarx_free_string. */
equarx_status equarx_pjrt_last_report(char** report_json, char** error);

/* Sets the options, finds the XLA-transform extension in `pjrt_api` (a
 * plugin's const PJRT_Api*) and registers the callback under `name` (NULL:
 * "equarx-quantize-collectives") at `stage` (0 pre-scheduler, 1
 * post-scheduler). A plugin without the extension is an error whose message
 * names the extensions it has. */
equarx_status equarx_pjrt_register(const void* pjrt_api, const char* name,
                                   int stage, const char* options_json,
                                   char** error);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EQUARX_H_ */
