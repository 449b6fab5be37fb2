//! The software device's code-object loader: a fuzzed ELF through `Device::load_module` (ELF64
//! header and program headers, the PT_LOAD image, the NT_AMDGPU_METADATA msgpack note, symbol
//! tables, kernel descriptors, then the decoder walking every reachable instruction) and
//! through `emulator::disassemble` (`strata emu disasm`). Properties: no panic; a loaded
//! module's kernels can be looked up by name.
//! Kernels are not launched (the executor is not this target's subject).
//!
//! Input: code-object bytes.
#![no_main]

use emulator::Device;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let device = Device::new();
    match device.load_module(data) {
        Ok(m) => {
            for k in m.kernels() {
                let f = m.function(&k.name).expect("a listed kernel is found by name");
                assert_eq!(f.info().name, k.name);
                let _ = k.args.iter().map(|a| a.offset as u64 + a.size as u64).max();
            }
            let _ = m.base();
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    match emulator::disassemble(data) {
        Ok(s) => assert!(!s.is_empty()),
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
