// equarx_pass.h — EQuARX as an xla::HloModulePass.
//
// Rewrites eligible sum all-reduces (bf16 by default) into a ring of int8
// collective-permutes with block-wise dynamic quantization; the wire carries
// about one byte per element instead of two.
//
//   before                               after (one lane, P ranks)
//
//   y = bf16[S] all-reduce(x),           q  = s8[...] quantize(own chunk)
//       to_apply=add                     ┌ P-1 times (reduce-scatter):
//                                        │ q' = s8[...] collective-permute(q)
//                                        │ q  = quantize(dequantize(q') + own)
//                                        └
//                                        g  = s8[P,...] all-gather(q)
//                                        y' = bf16[S] dequantize(g)
//
// The pass serializes the module, hands it to equarx (Rust, through the cxx
// bridge), and, when something changed, rebuilds the module from the
// returned proto with the module's own config and swaps its computations in
// place. Replica and partition counts come from the module's
// HloModuleConfig.
//
// Where it belongs: after SPMD partitioning (it needs per-device shapes and
// the final all-reduces), before async collective conversion and
// scheduling:
//
//   pipeline.AddPass<equarx::EquarxPass>(equarx::EquarxPassOptions{});
#ifndef EQUARX_CPP_SHIM_EQUARX_PASS_H_
#define EQUARX_CPP_SHIM_EQUARX_PASS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "xla/hlo/ir/hlo_module.h"
#include "xla/hlo/pass/hlo_pass_interface.h"
#include "xla/xla_data.pb.h"

namespace equarx {

// The pass's knobs; the defaults are the Rust library's.
struct EquarxPassOptions {
  enum class ScaleType { kF32, kBf16 };
  enum class Gather { kAllGather, kCollectivePermutes };

  // Elements per quantization block (one scale per block).
  int64_t block_size = 64;
  // Independent sub-chunk chains per ring direction, so the scheduler can
  // overlap one chain's transfer with another's quantize and add.
  int64_t pipeline_depth = 2;
  // Send half of every chunk each way round the ring.
  bool bidirectional = true;
  // All-reduces with a smaller payload (bytes, in their own type) stay.
  // Negative: equarx's cost model decides, for `topology`.
  int64_t min_payload_bytes = -1;
  // The machine the cost model predicts for: v5e, v6e, v5p, h100, h200,
  // optionally with a slice shape (v5e:4x4).
  std::string topology = "v5e";
  // Element types that are quantized. XLA:CPU promotes bf16 all-reduces to
  // f32 before scheduling; add xla::F32 there.
  std::vector<xla::PrimitiveType> element_types = {xla::BF16};
  ScaleType scale_type = ScaleType::kBf16;
  Gather gather = Gather::kAllGather;
};

class EquarxPass : public xla::HloModulePass {
 public:
  explicit EquarxPass(EquarxPassOptions options = {})
      : options_(std::move(options)) {}

  absl::string_view name() const override {
    return "equarx-quantized-all-reduce";
  }

  // The report of the last run: a JSON array, one object per all-reduce
  // (decision, reason, group size, wire bytes before/after, predicted
  // error). Empty before the first run.
  const std::string& last_report_json() const { return last_report_json_; }

 protected:
  absl::StatusOr<bool> RunImpl(
      xla::HloModule* module,
      const absl::flat_hash_set<absl::string_view>& execution_threads)
      override;

 private:
  EquarxPassOptions options_;
  std::string last_report_json_;
};

}  // namespace equarx

#endif  // EQUARX_CPP_SHIM_EQUARX_PASS_H_
