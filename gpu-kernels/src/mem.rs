//! Global-memory access helpers. ggml blocks are packed with 2-byte alignment (f16 scales),
//! so multi-word loads are declared with 2-byte alignment: gfx11 allows unaligned global
//! accesses, and LLVM then still emits single `global_load_b32/b64/b128` instructions.
//! All functions are `unsafe`: the caller guarantees the bytes are valid device memory
//! (the kernel ABI, `gpu-abi`, states the extents of every buffer).

#[repr(C, packed(2))]
#[derive(Clone, Copy)]
struct P2<T>(T);

/// # Safety
/// `p..p+2` is readable device memory, 2-byte aligned.
#[inline(always)]
pub unsafe fn ld_u16(p: *const u8) -> u16 {
    // SAFETY: caller contract.
    unsafe { (p as *const u16).read() }
}
/// # Safety
/// `p..p+4` is readable device memory, 2-byte aligned.
#[inline(always)]
pub unsafe fn ld_u32(p: *const u8) -> u32 {
    // SAFETY: caller contract; P2 has alignment 2.
    unsafe { (*(p as *const P2<u32>)).0 }
}
/// Splits a little-endian u128 into words. Loads go through u128/u64 rather than `[u32; N]`
/// so that no aggregate is copied through a stack slot (which would give the kernel a
/// private segment even when the copy is optimised away).
#[inline(always)]
pub fn words4(v: u128) -> [u32; 4] {
    [v as u32, (v >> 32) as u32, (v >> 64) as u32, (v >> 96) as u32]
}
/// Inverse of `words4`.
#[inline(always)]
pub fn join4(w: [u32; 4]) -> u128 {
    w[0] as u128 | (w[1] as u128) << 32 | (w[2] as u128) << 64 | (w[3] as u128) << 96
}
/// # Safety
/// `p..p+8` readable, 2-byte aligned.
#[inline(always)]
pub unsafe fn ld_u32x2(p: *const u8) -> [u32; 2] {
    // SAFETY: caller contract.
    let v = unsafe { (*(p as *const P2<u64>)).0 };
    [v as u32, (v >> 32) as u32]
}
/// # Safety
/// `p..p+16` readable, 2-byte aligned.
#[inline(always)]
pub unsafe fn ld_u32x4(p: *const u8) -> [u32; 4] {
    // SAFETY: caller contract.
    words4(unsafe { (*(p as *const P2<u128>)).0 })
}
/// # Safety
/// `p..p+16` readable, 16-byte aligned.
#[inline(always)]
pub unsafe fn ld_f32x4_aligned(p: *const f32) -> [f32; 4] {
    #[repr(C, align(16))]
    struct A([f32; 4]);
    // SAFETY: caller contract.
    unsafe { (*(p as *const A)).0 }
}
/// # Safety
/// `p..p+4` writable, 4-byte aligned, written by this work-item only.
#[inline(always)]
pub unsafe fn st_u32(p: *mut u8, v: u32) {
    // SAFETY: caller contract.
    unsafe { (p as *mut u32).write(v) }
}
/// # Safety
/// `p..p+2` writable, 2-byte aligned, written by this work-item only.
#[inline(always)]
pub unsafe fn st_u16(p: *mut u8, v: u16) {
    // SAFETY: caller contract.
    unsafe { (p as *mut u16).write(v) }
}
/// # Safety
/// `p..p+8` writable, 4-byte aligned, written by this work-item only.
#[inline(always)]
pub unsafe fn st_u32x2(p: *mut u8, v: [u32; 2]) {
    #[repr(C, align(4))]
    struct A([u32; 2]);
    // SAFETY: caller contract.
    unsafe { (p as *mut A).write(A(v)) }
}
/// # Safety
/// `p..p+16` writable, 4-byte aligned, written by this work-item only.
#[inline(always)]
pub unsafe fn st_u32x4(p: *mut u8, v: [u32; 4]) {
    #[repr(C, align(4))]
    struct A([u32; 4]);
    // SAFETY: caller contract.
    unsafe { (p as *mut A).write(A(v)) }
}
/// # Safety
/// `p..p+16` writable, 16-byte aligned, written by this work-item only.
#[inline(always)]
pub unsafe fn st_f32x4_aligned(p: *mut f32, v: [f32; 4]) {
    #[repr(C, align(16))]
    struct A([f32; 4]);
    // SAFETY: caller contract.
    unsafe { (p as *mut A).write(A(v)) }
}
/// f32 → f16 bits, round to nearest even (`v_cvt_f16_f32`), as ggml's `GGML_FP32_TO_FP16`.
/// `x` is fenced so that the f32 rounding of the expression that produced it is kept.
#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    (crate::arch::fp_fence(x) as f16).to_bits()
}
