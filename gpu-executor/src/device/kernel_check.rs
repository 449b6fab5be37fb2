//! Kernel metadata checks shared by both backends, so a mismatch between the host's argument
//! packing or geometry and the code object is a named error before the runtime sees it (on a
//! real GPU a wrong kernarg size or an oversized block is silent corruption or an opaque
//! `hipErrorInvalidValue`).
use super::error::{GpuError, Result};
use super::{KernelInfo, KernelSpec, LaunchConfig};

/// LDS per workgroup on gfx11.
pub const MAX_LDS_BYTES: u64 = 65536;
/// Hardware limit of work-items per workgroup.
pub const MAX_WORKGROUP: u64 = 1024;

/// Bytes of explicit (non-`hidden_*`) kernel arguments: the end of the last one.
pub fn kernarg_extent(info: &KernelInfo) -> u32 {
    info.args.iter().filter(|a| !a.value_kind.starts_with("hidden_")).map(|a| a.offset + a.size).max().unwrap_or(0)
}

/// The kernel's workgroup limit (metadata 0 means "not stated": the hardware's 1024).
fn max_workgroup(info: &KernelInfo) -> u64 {
    if info.max_flat_workgroup_size == 0 {
        MAX_WORKGROUP
    } else {
        (info.max_flat_workgroup_size as u64).min(MAX_WORKGROUP)
    }
}

fn threads(block: [u32; 3]) -> u64 {
    block.iter().map(|&b| b as u64).product()
}

fn fail(info: &KernelInfo, what: String) -> GpuError {
    GpuError::KernelCheck { kernel: info.name.clone(), what }
}

/// Checks a kernel's metadata against what the host will launch: wave32, kernarg extent equal
/// to the packed struct, block within `max_flat_workgroup_size`, static + dynamic LDS within
/// 64 KiB, no scratch unless allowed.
pub fn check_spec(info: &KernelInfo, spec: &KernelSpec) -> Result<()> {
    if info.wavefront_size != 32 {
        return Err(fail(info, format!("wavefront size {} (the kernels assume wave32)", info.wavefront_size)));
    }
    let extent = kernarg_extent(info);
    if extent != spec.kernarg_bytes {
        return Err(fail(
            info,
            format!(
                "kernarg size mismatch: the code object's explicit arguments span {extent} bytes, the host packs {}",
                spec.kernarg_bytes
            ),
        ));
    }
    if info.kernarg_size < extent {
        return Err(fail(info, format!("kernarg segment {} bytes < argument extent {extent}", info.kernarg_size)));
    }
    let t = threads(spec.max_block);
    if t == 0 || t > max_workgroup(info) {
        return Err(fail(
            info,
            format!(
                "block {:?} = {t} work-items exceeds max_flat_workgroup_size {}",
                spec.max_block,
                max_workgroup(info)
            ),
        ));
    }
    let lds = info.group_segment_size as u64 + spec.max_dynamic_lds as u64;
    if lds > MAX_LDS_BYTES {
        return Err(fail(
            info,
            format!(
                "LDS {} static + {} dynamic = {lds} bytes exceeds {MAX_LDS_BYTES}",
                info.group_segment_size, spec.max_dynamic_lds
            ),
        ));
    }
    if info.private_segment_size != 0 && !spec.allow_scratch {
        return Err(fail(
            info,
            format!("uses {} bytes of scratch per work-item (not allowed for this kernel)", info.private_segment_size),
        ));
    }
    Ok(())
}

/// Checks one launch: argument bytes equal to the kernel's extent, non-empty grid and block,
/// block within the kernel's limit, LDS within 64 KiB.
pub fn check_launch(info: &KernelInfo, cfg: &LaunchConfig, kernargs: &[u8]) -> Result<()> {
    let bad = |what: String| Err(GpuError::Launch { kernel: info.name.clone(), what });
    let extent = kernarg_extent(info) as usize;
    if kernargs.len() != extent {
        return bad(format!(
            "{} bytes of kernel arguments, the kernel's explicit arguments span {extent}",
            kernargs.len()
        ));
    }
    if cfg.grid.contains(&0) || cfg.block.contains(&0) {
        return bad(format!("empty grid {:?} / block {:?}", cfg.grid, cfg.block));
    }
    let t = threads(cfg.block);
    if t > max_workgroup(info) {
        return bad(format!(
            "block {:?} = {t} work-items exceeds max_flat_workgroup_size {}",
            cfg.block,
            max_workgroup(info)
        ));
    }
    if cfg.block[0] > 1024 || cfg.block[1] > 1024 || cfg.block[2] > 1024 {
        return bad(format!("block {:?}: each dimension is at most 1024", cfg.block));
    }
    let lds = info.group_segment_size as u64 + cfg.dynamic_lds as u64;
    if lds > MAX_LDS_BYTES {
        return bad(format!(
            "LDS {} static + {} dynamic = {lds} bytes exceeds {MAX_LDS_BYTES}",
            info.group_segment_size, cfg.dynamic_lds
        ));
    }
    Ok(())
}
