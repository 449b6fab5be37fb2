//! The gfx11 code objects built by `gpu-executor/build.rs` (nested cargo, one per arch) and
//! embedded 16-byte aligned, as `hipModuleLoadData` and the software device want them.

mod generated {
    include!(concat!(env!("OUT_DIR"), "/code_objects.rs"));
}

/// `(arch, ELF bytes)` for every embedded arch (default gfx1100, gfx1101, gfx1102).
pub fn code_objects() -> &'static [(&'static str, &'static [u8])] {
    generated::CODE_OBJECTS
}

/// The code object for a device arch as HIP reports it in `gcnArchName` (e.g. `gfx1100` or
/// `gfx1100:sramecc-:xnack-`); `None` if this build has none for it.
pub fn code_object_for(arch: &str) -> Option<&'static [u8]> {
    let base = arch.split(':').next().unwrap_or(arch).trim();
    generated::CODE_OBJECTS.iter().find(|(n, _)| *n == base).map(|(_, b)| *b)
}
