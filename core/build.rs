//! Compiles our HLO schema (`proto/xla/*.proto`) with protox, a pure-Rust
//! protobuf compiler, so no system `protoc` is needed. Maps become BTreeMaps
//! so that encoding is deterministic (same module, same bytes).
//!
//! Then generates the cxx bridge (`src/ffi/bridge.rs`): the header C++ sees
//! (`$OUT_DIR/cxxbridge/include/equarx/src/ffi/bridge.rs.h`, also linked at
//! `<target>/cxxbridge/equarx/src/ffi/bridge.rs.h`) and the C++ glue, which
//! is compiled into the library (so `libequarx.a` carries it).

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = ["proto/xla/hlo.proto", "proto/xla/xla.proto"];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    println!("cargo:rerun-if-changed=proto/xla/xla_data.proto");

    let fds = protox::compile(protos, ["proto"])?;
    // The descriptor set travels with the library: the decoder uses it to
    // prove that no field of an input is unknown to us (prost would drop it).
    std::fs::write(
        out.join("xla_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    // Box the rarely-set message fields of an instruction: unboxed, prost
    // makes every HloInstructionProto 4.7 KB, and a rewrite that emits a
    // hundred thousand instructions spends its time moving them.
    let boxed = [
        "literal",
        "window",
        "convolution_dimension_numbers",
        "padding_config",
        "outfeed_shape",
        "dot_dimension_numbers",
        "ragged_dot_dimension_numbers",
        "gather_dimension_numbers",
        "sharding",
        "backend_config_payload",
        "scatter_dimension_numbers",
        "precision_config",
        "domain_entry_sharding",
        "domain_exit_sharding",
        "triangular_solve_options",
        "cholesky_options",
        "parameter_replication",
        "frontend_attributes",
        "statistics_viz",
        "original_value",
        "result_accuracy",
        "sparsity_config",
        "collective_device_list",
        "iota_collective_device_list",
        "mesh_axes_replica_group_list",
    ];
    let mut config = prost_build::Config::new();
    for field in boxed {
        config.boxed(format!(".xla.HloInstructionProto.{field}"));
    }
    config.btree_map(["."]).compile_fds(fds)?;

    cxx_build::bridge("src/ffi/bridge.rs")
        .std("c++17")
        .compile("equarx-cxxbridge");
    Ok(())
}
