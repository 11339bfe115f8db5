//! The generated HLO protobuf types, from our wire-compatible schema in
//! `proto/xla/` (package `xla`). Nothing else lives here.

#![allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]

include!(concat!(env!("OUT_DIR"), "/xla.rs"));

/// The compiled schema as a serialized `FileDescriptorSet`, used to prove that
/// an input carries no field we do not know (prost would silently drop it).
pub const DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/xla_descriptor.bin"));
