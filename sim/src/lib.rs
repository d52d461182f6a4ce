//! A deterministic simulation of the whole pipeline, and the one checker of
//! the promise.
//!
//! - [`world`]: one seed of the deployment (intake, work queue, processor,
//!   reconciler, routes, operator) on the memory world, a virtual clock and
//!   one seeded entropy; faults and crashes at every port call, interleaved
//!   invocations, provider retries, a destination's outage.
//! - [`check`]: what "effectively once" means, checked on what a world holds
//!   at the end; the emulator's chaos seeds (`tests/it/chaos.rs`) use the
//!   same code.
//! - [`seeds`]: many seeds over the cores, their figures, and the command
//!   that replays a failing one.
//!
//! `scripts/simulate --seeds 1..100000` runs them (see `docs/guarantees.md`).

pub mod check;
pub mod seeds;
pub mod world;
