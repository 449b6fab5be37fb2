//! Expert tiering on the device: which routed experts live in VRAM and how the others reach
//! the products.
//!
//! - [`cache`]: the VRAM expert cache (slots per layer, admissions, adaptive swaps, profiles).
//! - [`handoff`]: the per-layer handoff to the CPU pool inside decode graphs.
//! - [`swap`]: adaptive residency's copies on a side stream.
//! - [`pcie`]: misses read from RAM over PCIe by the device.
//! - [`staging_ring`]: the ring prompt misses are copied through.

pub mod cache;
pub mod handoff;
pub mod pcie;
pub mod staging_ring;
pub mod swap;
