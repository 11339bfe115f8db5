//! `equarx simulate`'s numbers, one concern a file: the seeded generator
//! ([`rng`]), the synthetic inputs ([`inputs`]), the bit-exact reference of
//! the emitted collectives ([`reference`]), the baselines it is judged
//! against ([`baselines`]), how an error is measured ([`measure`]), and the
//! sweep the command prints ([`sweep`]). Everything is re-exported here, so
//! callers write `numerics::simulate::run` whichever file holds it.

pub mod baselines;
pub mod inputs;
pub mod measure;
pub mod reference;
pub mod rng;
pub mod sweep;

pub use baselines::{bf16_ring, exact_sum, per_tensor_int8};
pub use inputs::Distribution;
pub use measure::{ErrorStats, error, to_bf16};
pub use reference::{pairwise_sum, quantized_all_reduce, run};
pub use rng::Rng;
pub use sweep::{Sweep, SweepRow, crest_seen, sweep};
