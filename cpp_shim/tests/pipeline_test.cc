// pipeline_test.cc — runs equarx::EquarxPass inside a real
// xla::HloPassPipeline (XLA from the tensorflow-cpu wheel's
// libtensorflow_cc), with xla::HloVerifier as invariant checker.
//
//   pipeline_test CASE...
//   CASE = FIXTURE.pb|EXPECT|OPTIONS
//   EXPECT = changed | unchanged | ok (either) | error
//   OPTIONS = NAME=VALUE pairs separated by ';', handed to
//             EquarxPassOptions::Set as they are (equarx's option names
//             and values, e.g. min_payload_bytes=0;types=bf16,f32)
//
// Prints one JSON object per case on stdout; exits 1 if any case does not
// meet its expectation.
#include <cstdint>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_split.h"
#include "equarx_pass.h"
#include "xla/debug_options_flags.h"
#include "xla/hlo/ir/hlo_computation.h"
#include "xla/hlo/ir/hlo_instruction.h"
#include "xla/hlo/ir/hlo_module.h"
#include "xla/hlo/ir/hlo_opcode.h"
#include "xla/hlo/pass/hlo_pass_pipeline.h"
#include "xla/service/hlo.pb.h"
#include "xla/service/hlo_module_config.h"
#include "xla/service/hlo_verifier.h"

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "?";
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// The test adds no knowledge of its own: every name and value goes to
// equarx as it is, and equarx judges it.
absl::StatusOr<equarx::EquarxPassOptions> ParseOptions(const std::string& s) {
  equarx::EquarxPassOptions o;
  if (s.empty()) return o;
  for (absl::string_view kv : absl::StrSplit(s, ';')) {
    std::vector<std::string> p = absl::StrSplit(kv, absl::MaxSplits('=', 1));
    if (p.size() != 2) return absl::InvalidArgumentError(std::string(kv));
    o.Set(p[0], p[1]);
  }
  return o;
}

absl::StatusOr<std::unique_ptr<xla::HloModule>> LoadModule(
    const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  xla::HloModuleProto proto;
  if (!proto.ParseFromString(ss.str())) {
    return absl::InvalidArgumentError(path + " is not an HloModuleProto");
  }
  absl::StatusOr<xla::HloModuleConfig> config =
      xla::HloModule::CreateModuleConfigFromProto(
          proto, xla::DefaultDebugOptionsIgnoringFlags());
  if (!config.ok()) return config.status();
  if (proto.has_device_assignment()) {
    // What XLA's compiler would set from the compile options.
    config->set_replica_count(proto.device_assignment().replica_count());
    config->set_num_partitions(proto.device_assignment().computation_count());
    config->set_use_spmd_partitioning(
        proto.device_assignment().computation_count() > 1);
  }
  return xla::HloModule::CreateFromProto(proto, *config);
}

struct Census {
  // Collectives that move s8 (the quantized codes, whichever algorithm:
  // ring permutes, a two-shot all-to-all, the gather).
  int s8_collectives = 0;
  int collective_permutes = 0;
  int all_reduces = 0;
  int all_gathers = 0;
  int all_to_alls = 0;
  int whiles = 0;
};

// Whether a shape is s8, or a tuple whose first element is.
bool IsS8(const xla::Shape& shape) {
  if (shape.IsTuple())
    return shape.tuple_shapes_size() > 0 && IsS8(shape.tuple_shapes(0));
  return shape.IsArray() && shape.element_type() == xla::S8;
}

Census Count(const xla::HloModule& module) {
  Census c;
  for (const xla::HloComputation* comp : module.computations()) {
    for (const xla::HloInstruction* instr : comp->instructions()) {
      switch (instr->opcode()) {
        case xla::HloOpcode::kCollectivePermute:
        case xla::HloOpcode::kCollectivePermuteStart:
          c.collective_permutes++;
          c.s8_collectives += IsS8(instr->shape());
          break;
        case xla::HloOpcode::kAllReduce:
        case xla::HloOpcode::kAllReduceStart:
          c.all_reduces++;
          break;
        case xla::HloOpcode::kAllGather:
          c.all_gathers++;
          c.s8_collectives += IsS8(instr->shape());
          break;
        case xla::HloOpcode::kAllToAll:
          c.all_to_alls++;
          c.s8_collectives += IsS8(instr->shape());
          break;
        case xla::HloOpcode::kWhile:
          c.whiles++;
          break;
        default:
          break;
      }
    }
  }
  return c;
}

// Runs one case; returns whether it met its expectation.
bool RunCase(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, '|');
  if (parts.size() != 3) {
    std::cerr << "bad case " << spec << "\n";
    return false;
  }
  const std::string& path = parts[0];
  const std::string& expect = parts[1];
  std::ostringstream json;
  json << "{\"case\":" << JsonString(spec);
  auto finish = [&](bool ok, const std::string& problem) {
    json << ",\"ok\":" << (ok ? "true" : "false")
         << ",\"problem\":" << JsonString(problem) << "}";
    std::cout << json.str() << std::endl;
    return ok;
  };

  absl::StatusOr<equarx::EquarxPassOptions> options = ParseOptions(parts[2]);
  if (!options.ok()) return finish(false, options.status().ToString());
  absl::StatusOr<std::unique_ptr<xla::HloModule>> module = LoadModule(path);
  if (!module.ok()) return finish(false, module.status().ToString());
  xla::HloModule* m = module->get();
  const int64_t replicas = m->config().replica_count();
  const int64_t partitions = m->config().num_partitions();
  const Census before = Count(*m);
  const bool scheduled = m->has_schedule();

  xla::HloPassPipeline pipeline("equarx-test");
  pipeline.AddInvariantChecker<xla::HloVerifier>(
      /*layout_sensitive=*/false, /*allow_mixed_precision=*/false);
  equarx::EquarxPass& pass = pipeline.AddPass<equarx::EquarxPass>(*options);
  absl::StatusOr<bool> changed = pipeline.Run(m);

  // Check() sees the options as Run does, without a module.
  absl::Status checked = options->Check();
  json << ",\"check\":"
       << JsonString(checked.ok() ? "ok" : checked.ToString());
  json << ",\"module\":" << JsonString(m->name())
       << ",\"replica_count\":" << replicas
       << ",\"num_partitions\":" << partitions
       << ",\"all_reduces_before\":" << before.all_reduces;
  if (!changed.ok()) {
    json << ",\"status\":" << JsonString(changed.status().ToString());
    bool ok = expect == "error";
    return finish(ok, ok ? "" : "the pipeline failed");
  }
  if (expect == "ok") {
    // Accepted; what it does to the module is the other cases' business.
    bool verified = xla::HloVerifier(false, false).Run(m).ok();
    return finish(verified, verified ? "" : "the verifier refused the module");
  }
  // Verify once more on the final module, stand-alone.
  xla::HloVerifier verifier(/*layout_sensitive=*/false,
                            /*allow_mixed_precision=*/false);
  absl::StatusOr<bool> verified = verifier.Run(m);
  const Census after = Count(*m);
  // A scheduled module stays scheduled, with a schedule XLA accepts.
  std::string schedule = "none";
  if (m->has_schedule()) {
    absl::Status valid = m->schedule().Verify();
    schedule = valid.ok() ? "valid" : valid.ToString();
  }
  json << ",\"changed\":" << (*changed ? "true" : "false")
       << ",\"verifier\":"
       << JsonString(verified.ok() ? "ok" : verified.status().ToString())
       << ",\"s8_collectives\":" << after.s8_collectives
       << ",\"collective_permutes\":" << after.collective_permutes
       << ",\"all_to_alls\":" << after.all_to_alls
       << ",\"whiles\":" << after.whiles
       << ",\"all_reduces_after\":" << after.all_reduces
       << ",\"all_gathers_after\":" << after.all_gathers
       << ",\"scheduled_before\":" << (scheduled ? "true" : "false")
       << ",\"schedule_after\":" << JsonString(schedule)
       << ",\"config_kept\":"
       << (m->config().replica_count() == replicas &&
                   m->config().num_partitions() == partitions
               ? "true"
               : "false")
       << ",\"report\":"
       << (pass.last_report_json().empty() ? "null" : pass.last_report_json());

  if (!verified.ok()) return finish(false, "the verifier refused the module");
  if (scheduled && schedule != "valid")
    return finish(false, "the module lost its schedule or it is invalid");
  if (expect == "error") return finish(false, "expected an error");
  if (expect == "changed") {
    if (!*changed) return finish(false, "expected a change");
    if (after.s8_collectives == 0) return finish(false, "no s8 collective");
    // Nothing left for a second run: the pass is idempotent on its output.
    xla::HloPassPipeline again("equarx-again");
    again.AddInvariantChecker<xla::HloVerifier>(false, false);
    again.AddPass<equarx::EquarxPass>(*options);
    absl::StatusOr<bool> changed_again = again.Run(m);
    if (!changed_again.ok())
      return finish(false, "second run: " + changed_again.status().ToString());
    if (*changed_again) return finish(false, "second run changed the module");
    return finish(true, "");
  }
  if (*changed) return finish(false, "expected no change");
  if (after.s8_collectives != 0)
    return finish(false, "s8 collectives in an unchanged module");
  return finish(true, "");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: " << argv[0] << " FIXTURE.pb|EXPECT|OPTIONS...\n";
    return 2;
  }
  int failed = 0;
  for (int i = 1; i < argc; ++i) {
    if (!RunCase(argv[i])) ++failed;
  }
  return failed == 0 ? 0 : 1;
}
