//! Device tests written once, run per device: [`test_device!`](crate::test_device) turns one
//! test body over a `&GpuOps` into a module of tests, one per device, so a test report says
//! which device ran what:
//!
//! ```text
//! test gpu::gpu_ops::gpu_ops_rms_norm_bitwise::emu ... ok  the software RDNA3 device, always
//! test gpu::gpu_ops::gpu_ops_rms_norm_bitwise::hip ... ok  a card through HIP; when
//!                                                          open_device(Device::Hip) fails it
//!                                                          prints why and passes
//! ```
//!
//! (`name::emu` rather than `name_emu`: `macro_rules!` cannot build new identifiers, and a
//! crate to paste them is not worth a dependency.) Each test opens its own device, so the
//! software device's launch counters (`GpuApi::take_stats`) are that test's alone.
use super::device::{Device, GpuApi, open_device};
use super::ops::GpuOps;
use std::sync::Arc;

/// Opens `device` for a device test. The software device must open (a panic otherwise); a card
/// that is absent is `Err(why)`, the test's reason to skip; a card that opens but whose kernels
/// do not load is a panic (a failure, not a skip).
pub fn open_ops(device: Device) -> Result<GpuOps, String> {
    let api: Arc<dyn GpuApi> = match open_device(device) {
        Ok(api) => Arc::from(api),
        Err(e) if device == Device::Emu => panic!("the software device does not open: {e}"),
        Err(e) => return Err(e.to_string()),
    };
    let info = api.info().clone();
    Ok(GpuOps::new(api)
        .unwrap_or_else(|e| panic!("{} ({}) opened but its kernels do not load: {e}", info.name, info.arch)))
}

/// A device opened for a model-level test: its name (`"emu"`, `"hip"`) and its api.
pub type TestDevice = (&'static str, Arc<dyn GpuApi>);

/// The device a model-level test runs on, as `(name, api)`: the software device always (a
/// panic if it does not open); a card through HIP when one opens, else `None` after printing
/// why (the test's reason to skip). Model tests build whole sessions over the `GpuApi`, so they
/// take the api, not a [`GpuOps`].
pub fn api_for(device: Device) -> Option<TestDevice> {
    match open_device(device) {
        Ok(api) => Some((if device == Device::Emu { "emu" } else { "hip" }, Arc::from(api))),
        Err(e) if device == Device::Emu => panic!("the software device does not open: {e}"),
        Err(e) => {
            eprintln!("skipped: no card opens through HIP ({e})");
            None
        }
    }
}

/// Defines one test per device from one body: `test_device!(fn name(ops) { .. })` makes the
/// tests `name::emu` and `name::hip`, each running the body with `ops: &GpuOps` on its device
/// (`hip` skips, printing why, when no card opens). `test_device!(emu_only fn name(ops) { .. })`
/// makes only `name::emu`, for bodies that need the software device (its instruction and byte
/// counters, traps). `test_device!(model fn name(device) { .. })` runs the body with
/// `device: &TestDevice`, opened once by [`api_for`], for tests that build whole models on it;
/// its `hip` test returns before the body when no card opens. The body sees the items of the
/// enclosing module.
#[macro_export]
macro_rules! test_device {
    ($(#[$meta:meta])* fn $name:ident($ops:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn emu() {
                let ops = $crate::test_device::open_ops($crate::options::Device::Emu).unwrap_or_else(|e| panic!("{e}"));
                let $ops: &$crate::ops::GpuOps = &ops;
                $body
            }
            #[test]
            fn hip() {
                match $crate::test_device::open_ops($crate::options::Device::Hip) {
                    Ok(ops) => {
                        let $ops: &$crate::ops::GpuOps = &ops;
                        $body
                    }
                    Err(why) => eprintln!("skipped: no card opens through HIP ({why})"),
                }
            }
        }
    };
    ($(#[$meta:meta])* model fn $name:ident($device:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn emu() {
                let opened = $crate::test_device::api_for($crate::options::Device::Emu).expect("api_for panics when emu fails");
                let $device: &$crate::test_device::TestDevice = &opened;
                $body
            }
            #[test]
            fn hip() {
                let Some(opened) = $crate::test_device::api_for($crate::options::Device::Hip) else { return };
                let $device: &$crate::test_device::TestDevice = &opened;
                $body
            }
        }
    };
    ($(#[$meta:meta])* emu_only fn $name:ident($ops:ident) $body:block) => {
        $(#[$meta])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            #[test]
            fn emu() {
                let ops = $crate::test_device::open_ops($crate::options::Device::Emu).unwrap_or_else(|e| panic!("{e}"));
                let $ops: &$crate::ops::GpuOps = &ops;
                $body
            }
        }
    };
}
