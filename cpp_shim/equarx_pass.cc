// equarx_pass.cc — see equarx_pass.h.
#include "equarx_pass.h"

#include <climits>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "equarx/src/ffi/bridge.rs.h"
#include "rust/cxx.h"
#include "xla/hlo/ir/hlo_computation.h"
#include "xla/hlo/ir/hlo_instruction.h"
#include "xla/hlo/ir/hlo_schedule.h"
#include "xla/service/hlo.pb.h"

namespace equarx {
namespace {

std::vector<bridge::OptionValue> ToBridge(const EquarxPassOptions& o) {
  std::vector<bridge::OptionValue> pairs;
  pairs.reserve(o.values().size());
  for (const auto& [name, value] : o.values()) {
    // Lossy: text that is not UTF-8 reaches equarx (and its message) with
    // U+FFFD instead of aborting the process.
    pairs.push_back(bridge::OptionValue{rust::String::lossy(name),
                                        rust::String::lossy(value)});
  }
  return pairs;
}

}  // namespace

EquarxPassOptions& EquarxPassOptions::Set(absl::string_view name,
                                          absl::string_view value) {
  values_.emplace_back(std::string(name), std::string(value));
  return *this;
}

absl::Status EquarxPassOptions::Check() const {
  std::vector<bridge::OptionValue> pairs = ToBridge(*this);
  rust::String error = bridge::check_options(
      rust::Slice<const bridge::OptionValue>(pairs.data(), pairs.size()));
  if (error.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("equarx: ", std::string(error)));
}

absl::StatusOr<bool> EquarxPass::RunImpl(
    xla::HloModule* module,
    const absl::flat_hash_set<absl::string_view>& execution_threads) {
  // equarx rewrites computations of the main thread only.
  if (!execution_threads.empty() &&
      !execution_threads.contains(xla::HloInstruction::kMainExecutionThread)) {
    return false;
  }
  // XLA's pipeline skips the pass by its name; its old name still works.
  for (const std::string& disabled :
       module->config().debug_options().xla_disable_hlo_passes()) {
    if (disabled == kOldName) return false;
  }
  std::string bytes;
  if (!module->ToProto().SerializeToString(&bytes)) {
    return absl::InternalError(
        absl::StrCat(name(), ": cannot serialize module ", module->name()));
  }
  // Every check of the options is equarx's own (its message comes back
  // below). XLA knows the counts; the proto alone does not carry them.
  std::vector<bridge::OptionValue> pairs = ToBridge(options_);
  bridge::RewriteResult result = bridge::rewrite_module(
      rust::Slice<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                 bytes.size()),
      rust::Slice<const bridge::OptionValue>(pairs.data(), pairs.size()),
      module->config().replica_count(), module->config().num_partitions());
  if (!result.ok) {
    std::string message = absl::StrCat(name(), " on module ", module->name(),
                                       ": ", std::string(result.error));
    return result.options_error ? absl::InvalidArgumentError(message)
                                : absl::InternalError(message);
  }
  last_report_json_ = std::string(result.report_json);
  if (!result.changed) return false;

  if (result.module.size() > static_cast<size_t>(INT_MAX)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        name(), ": the rewritten module is larger than protobuf can parse"));
  }
  xla::HloModuleProto rewritten;
  if (!rewritten.ParseFromArray(result.module.data(),
                                static_cast<int>(result.module.size()))) {
    return absl::InternalError(absl::StrCat(
        name(), ": equarx returned bytes that are not an HloModuleProto"));
  }
  absl::StatusOr<std::unique_ptr<xla::HloModule>> fresh =
      xla::HloModule::CreateFromProto(rewritten, module->config());
  if (!fresh.ok()) {
    return absl::InternalError(absl::StrCat(
        name(), ": XLA refused the rewritten module: ",
        fresh.status().ToString()));
  }
  // A scheduled module comes back with a schedule (equarx keeps it a valid
  // order). Schedules are keyed by unique ids, which the move below
  // reassigns: keep the sequences by pointer and rebuild the schedule after.
  std::vector<std::pair<const xla::HloComputation*,
                        std::vector<xla::HloInstruction*>>>
      sequences;
  if ((*fresh)->has_schedule()) {
    const xla::HloSchedule& schedule = (*fresh)->schedule();
    for (const xla::HloComputation* c : (*fresh)->computations()) {
      if (schedule.is_computation_scheduled(c)) {
        sequences.emplace_back(c, schedule.sequence(c).instructions());
      }
    }
  }
  // Swap the new computations in; the module object (and its config, its
  // unique id, the pipeline's references to it) stays.
  module->clear_schedule();
  module->MoveComputationsFrom(fresh->get());
  absl::Status removed = module->RemoveUnusedComputations();
  if (!removed.ok()) return removed;
  if (!sequences.empty()) {
    // Computations equarx left unused (e.g. the all-reduce's reducer) were
    // just removed: only the live ones get a sequence.
    absl::flat_hash_set<const xla::HloComputation*> live;
    for (const xla::HloComputation* c : module->computations()) live.insert(c);
    xla::HloSchedule schedule(module);
    for (const auto& [computation, sequence] : sequences) {
      if (live.contains(computation)) {
        schedule.set_sequence(computation, sequence);
      }
    }
    absl::Status scheduled = module->set_schedule(std::move(schedule));
    if (!scheduled.ok()) {
      return absl::InternalError(absl::StrCat(
          name(), ": the rewritten schedule is invalid: ", scheduled.ToString()));
    }
  }
  // Names equarx chose are unknown to the module's name uniquers; register
  // them so that later passes never hand out the same name again.
  for (xla::HloComputation* computation : module->computations()) {
    module->computation_name_uniquer().GetUniqueName(computation->name());
    for (xla::HloInstruction* instruction : computation->instructions()) {
      module->instruction_name_uniquer().GetUniqueName(instruction->name());
    }
  }
  return true;
}

}  // namespace equarx
