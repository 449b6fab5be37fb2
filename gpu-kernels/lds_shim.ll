; LLVM-IR shim for what Rust 1.96 cannot spell on amdgcn: a pointer into workgroup memory
; (addrspace 3) and a workgroup-scope fenced barrier (= HIP __syncthreads). Assembled by
; build.rs and linked into the same LTO unit (-Clinker-plugin-lto), so both are inlined.
target datalayout = "e-m:e-p:64:64-p1:64:64-p2:32:32-p3:32:32-p4:64:64-p5:32:32-p6:32:32-p7:160:256:256:32-p8:128:128:128:48-p9:192:256:256:32-i64:64-v16:16-v24:32-v32:32-v48:64-v96:128-v192:256-v256:256-v512:512-v1024:1024-v2048:2048-n32:64-S32-A5-G1-ni:7:8:9"
target triple = "amdgcn-amd-amdhsa"

; Launch-sized (dynamic) LDS: its size is the `dynamic_lds` byte count of the launch.
@strata_lds_dyn = external addrspace(3) global [0 x i8], align 16

define ptr @strata_lds_base() #0 {
  ret ptr addrspacecast (ptr addrspace(3) @strata_lds_dyn to ptr)
}
attributes #0 = { alwaysinline nounwind willreturn memory(none) }

define void @strata_barrier_wg() #1 {
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  ret void
}
declare void @llvm.amdgcn.s.barrier() #2
attributes #1 = { alwaysinline nounwind convergent }
attributes #2 = { nounwind convergent willreturn }

; Static LDS for per-type lookup tables (IQ3_XXS grid + sign masks, 3 KiB). Unlike the dynamic
; region, whose address is only known after LDS allocation (an `add 0` before every access),
; a static variable's address folds into the ds_* offset field. Allocated only in kernels that
; reach it.
@strata_lds_tables = internal addrspace(3) global [3072 x i8] poison, align 16

define ptr @strata_lds_tables_base() #0 {
  ret ptr addrspacecast (ptr addrspace(3) @strata_lds_tables to ptr)
}
