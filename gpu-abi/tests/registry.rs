//! Host checks of the ABI and the registry that need no kernel toolchain (the checks against
//! the code objects are tests/gpu/gpu_kernels.rs). A file outside `src/`, so editing it does not
//! rebuild the kernels (gpu-executor/build.rs watches `gpu-abi/src`).
use gpu_abi::registry::{self, Family, GFX11_ARCHS};
use gpu_abi::{MAX_COLS, MAX_GLU_COLS, WG_SIZE, WType};
use std::collections::HashSet;

#[test]
fn every_kernel_is_listed_once_with_a_launchable_entry() {
    let mut seen = HashSet::new();
    for k in registry::all() {
        assert!(seen.insert(k.name), "{} is listed twice", k.name);
        assert!(k.block >= 1 && k.block <= WG_SIZE, "{}: block {}", k.name, k.block);
        assert!(k.archs.iter().all(|a| GFX11_ARCHS.contains(a)), "{}: archs {:?}", k.name, k.archs);
        // The fields cover the struct exactly: 8-byte fields, then 4-byte ones.
        let end = k.args.fields().last().map(|(o, s)| o + s).unwrap_or(0);
        assert_eq!(end, k.args.bytes, "{}: fields of {} end at {end}", k.name, k.args.name);
    }
}

#[test]
fn the_lookup_functions_name_registry_kernels() {
    let is = |name: Option<&'static str>, family: Family| {
        let name = name.expect("a kernel of the lists");
        let entry = registry::find(name).unwrap_or_else(|| panic!("{name} is not in the registry"));
        assert_eq!(entry.family, family, "{name}");
    };
    for ty in WType::ALL {
        for n in 1..=MAX_COLS as u32 {
            is(gpu_abi::mmvq_kernel(ty, n), Family::Mmvq);
        }
        for n in 1..=MAX_GLU_COLS {
            is(gpu_abi::mmvq_glu_kernel(ty, n), Family::MmvqGlu);
        }
        for glu in [false, true] {
            is(gpu_abi::mmvq_moe_kernel(ty, glu, 1), Family::MmvqMoe);
            is(gpu_abi::mmvq_moe_kernel(ty, glu, gpu_abi::mmvq_moe_max_group(ty, glu)), Family::MmvqMoe);
        }
        for f16 in [false, true] {
            is(gpu_abi::dequant_kernel(ty, f16), Family::Dequant);
        }
        for dot4 in [false, true] {
            is(gpu_abi::mmq_kernel(ty, dot4), Family::Mmq);
        }
        is(gpu_abi::get_rows_kernel(ty), Family::GetRows);
        assert_eq!(WType::from_ggml_id(ty.ggml_id()), Some(ty));
    }
}
