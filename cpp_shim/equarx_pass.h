// equarx_pass.h — EQuARX as an xla::HloModulePass.
//
// Rewrites eligible collectives (bf16 by default): sum all-reduces,
// reduce-scatters, all-gathers and all-to-alls become block-wise dynamically
// quantized transfers of int8, fp8 or int4 codes with f32 accumulation; the
// wire carries about one byte per element instead of two, or half a byte.
// Per op the pass picks the algorithm (ring, two-shot, two-level) and
// whether to Hadamard-rotate the blocks first. The ring, for example:
//
//   before                               after (one lane, P ranks)
//
//   y = bf16[S] all-reduce(x),           q  = s8[...] quantize(own chunk)
//       to_apply=add                     ┌ while s < P-1 (reduce-scatter):
//                                        │ q' = s8[...] collective-permute(q)
//                                        │ q  = quantize(dequantize(q') + own)
//                                        └
//                                        g  = s8[P,...] all-gather(q)
//                                        y' = bf16[S] dequantize(g)
//
// two-shot: every chunk quantized once, one all-to-all, the owner sums in
// f32, quantizes once more, all-gather; every rank dequantizes the same codes.
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

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "xla/hlo/ir/hlo_module.h"
#include "xla/hlo/pass/hlo_pass_interface.h"

namespace equarx {

// The pass's options, as names and values in equarx's one option list
// (core/src/options/schema.rs; `equarx rewrite --help`, the README's "Options" and
// cpp_shim/README.md list them). A value is written as on equarx's command
// line: `--block-size 32` is Set("block_size", 32), `--types bf16,f32` is
// Set("types", "bf16,f32"). Options not set keep equarx's defaults;
// replica and partition counts come from the module's HloModuleConfig
// unless set here. equarx checks everything (names, values, ranges) with
// the same messages as its other doors: at Check(), or when the pass runs.
//
//   equarx::EquarxPassOptions options;
//   options.Set("min_payload_bytes", "1MiB").Set("types", "bf16,f32");
//   pipeline.AddPass<equarx::EquarxPass>(options);
class EquarxPassOptions {
 public:
  EquarxPassOptions& Set(absl::string_view name, absl::string_view value);
  EquarxPassOptions& Set(absl::string_view name, const char* value) {
    return Set(name, absl::string_view(value));
  }
  EquarxPassOptions& Set(absl::string_view name, bool value) {
    return Set(name, absl::string_view(value ? "true" : "false"));
  }
  template <typename Int,
            std::enable_if_t<std::is_integral_v<Int> && !std::is_same_v<Int, bool>,
                             int> = 0>
  EquarxPassOptions& Set(absl::string_view name, Int value) {
    return Set(name, absl::string_view(std::to_string(value)));
  }

  // OK, or InvalidArgument with equarx's message.
  absl::Status Check() const;

  // What was set, in order.
  const std::vector<std::pair<std::string, std::string>>& values() const {
    return values_;
  }

 private:
  std::vector<std::pair<std::string, std::string>> values_;
};

class EquarxPass : public xla::HloModulePass {
 public:
  explicit EquarxPass(EquarxPassOptions options = {})
      : options_(std::move(options)) {}

  // The pass's name in XLA's pipeline (--xla_disable_hlo_passes takes it,
  // or kOldName, the name of the pass before it rewrote more than
  // all-reduces).
  absl::string_view name() const override { return kName; }
  static constexpr absl::string_view kName = "equarx-quantize-collectives";
  static constexpr absl::string_view kOldName = "equarx-quantized-all-reduce";

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
