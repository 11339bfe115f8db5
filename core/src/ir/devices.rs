//! How many replicas and partitions a module runs with.
//!
//! `HloModuleProto` does not say (XLA keeps the counts in the module's
//! config), so they come from where the input does say: a container's
//! config or device assignment, a text header, or the caller's options.
//! Every layer that reads or writes modules uses this one type; it depends
//! on nothing, so `io`, `text` and the passes all point down to it.

/// The device counts a module runs with, where the input says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceCounts {
    pub replica_count: Option<i64>,
    pub num_partitions: Option<i64>,
}

impl DeviceCounts {
    /// These counts, with every count `over` sets taking its place (the
    /// caller's options over what the module says).
    pub fn overridden_by(self, over: DeviceCounts) -> DeviceCounts {
        DeviceCounts {
            replica_count: over.replica_count.or(self.replica_count),
            num_partitions: over.num_partitions.or(self.num_partitions),
        }
    }
}
