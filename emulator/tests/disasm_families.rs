//! The disassembler on every gfx11 encoding family against `llvm-objdump-22 -d
//! --mcpu=gfx1100`, line for line (the comment column included): a hand-written .s with
//! instructions of each family, words with random fields in each family's encoding, and words
//! that are no instruction. Skips (with a notice) when llvm-mc-22 / llvm-objdump-22 are absent.
mod common;

use common::objdump::compare;

#[test]
fn every_encoding_family() {
    let body = r#"
  s_mov_b32 s0, 0x1234
  s_add_u32 s1, s2, s3
  s_movk_i32 s4, 0x10
  s_cmp_eq_u32 s0, s1
  s_load_b64 s[2:3], s[0:1], 0x8
  s_waitcnt lgkmcnt(0)
  v_mov_b32 v1, s0
  v_add_f32 v2, v1, v3
  v_fma_f32 v4, v1, v2, v3
  v_cmp_lt_f32_e32 vcc_lo, v1, v2
  v_pk_add_f16 v5, v6, v7
  v_dual_mul_f32 v0, v1, v2 :: v_dual_add_f32 v3, v4, v5
  ds_load_b32 v1, v2 offset:8
  global_load_b32 v1, v2, s[2:3]
  flat_store_b32 v[2:3], v1
  scratch_load_b32 v1, off, off offset:16
  buffer_load_b32 v1, off, s[4:7], 0
  buffer_load_b32 v1, v2, s[4:7], s3 offen offset:16
  buffer_load_b32 v1, v2, s[4:7], 0 idxen
  buffer_load_b64 v[1:2], v[2:3], s[4:7], s3 idxen offen offset:4095 glc slc dlc
  buffer_load_b128 v[4:7], v2, s[8:11], m0 offen
  buffer_load_u8 v1, v2, s[4:7], 0 offen offset:1
  buffer_load_d16_hi_b16 v1, v2, s[4:7], 0 offen
  buffer_load_format_xyzw v[1:4], off, s[4:7], 0
  buffer_load_d16_format_xyz v[1:2], off, s[4:7], 0
  buffer_store_b32 v1, off, s[4:7], s3
  buffer_store_b96 v[1:3], v4, s[4:7], 0 offen offset:12
  buffer_store_b16 v1, v2, s[4:7], 0 idxen glc
  buffer_atomic_add_u32 v1, v2, s[4:7], 0 offen glc
  buffer_atomic_add_f32 v1, off, s[4:7], 0
  buffer_atomic_cmpswap_b32 v[1:2], off, s[4:7], 0 glc
  buffer_atomic_cmpswap_b64 v[4:7], v2, s[4:7], s5 offen
  buffer_atomic_max_u64 v[2:3], off, s[12:15], 0 offset:8
  buffer_gl0_inv
  buffer_gl1_inv
  tbuffer_load_format_x v1, off, s[4:7], 0
  tbuffer_load_format_x v1, off, s[4:7], 0 format:[BUF_FMT_32_FLOAT]
  tbuffer_load_format_xy v[1:2], v2, s[4:7], format:22, s3 offen offset:8
  tbuffer_load_format_xyzw v[1:4], v[2:3], s[4:7], 0 format:[BUF_FMT_8_8_8_8_UNORM] idxen offen
  tbuffer_store_format_x v1, off, s[4:7], 0
  tbuffer_store_d16_format_xy v1, v2, s[4:7], s9 format:[BUF_FMT_16_16_FLOAT] idxen glc slc
  image_load v[1:4], v[2:3], s[8:15] dmask:0xf dim:SQ_RSRC_IMG_2D
  image_load v1, v2, s[8:15] dmask:0x1 dim:SQ_RSRC_IMG_1D unorm
  image_load v[1:2], v[2:4], s[8:15] dmask:0x3 dim:SQ_RSRC_IMG_3D glc
  image_load v[1:3], v[2:3], s[8:15] dmask:0xf dim:SQ_RSRC_IMG_2D tfe d16
  image_load_mip v[1:4], v[2:4], s[8:15] dmask:0xf dim:SQ_RSRC_IMG_2D
  image_load v[1:4], v2, s[8:15] dmask:0xf dim:SQ_RSRC_IMG_2D a16
  image_load v1, v[2:4], s[8:15] dmask:0x4 dim:SQ_RSRC_IMG_2D_MSAA
  image_msaa_load v[1:4], v[2:4], s[8:15] dmask:0x2 dim:SQ_RSRC_IMG_2D_MSAA
  image_sample v[1:4], v[2:3], s[8:15], s[16:19] dmask:0xf dim:SQ_RSRC_IMG_2D
  image_sample v1, v2, s[8:15], s[16:19] dmask:0x1 dim:SQ_RSRC_IMG_1D
  image_sample_l v[1:3], v[2:5], s[8:15], s[16:19] dmask:0x7 dim:SQ_RSRC_IMG_CUBE
  image_sample_c_l v[1:2], [v2, v3, v4, v5], s[8:15], s[16:19] dmask:0x3 dim:SQ_RSRC_IMG_2D
  image_sample_d v[1:4], v[2:7], s[8:15], s[16:19] dmask:0xf dim:SQ_RSRC_IMG_2D
  image_sample_b v[1:4], [v2, v3, v4], s[8:15], s[16:19] dmask:0xf dim:SQ_RSRC_IMG_2D
  image_sample_lz v[1:4], v[2:4], s[8:15], s[16:19] dmask:0xf dim:SQ_RSRC_IMG_2D_ARRAY
  image_gather4 v[1:4], v[2:3], s[8:15], s[16:19] dmask:0x1 dim:SQ_RSRC_IMG_2D
  image_gather4_c_lz v[1:4], v[2:4], s[8:15], s[16:19] dmask:0x2 dim:SQ_RSRC_IMG_2D
  image_get_lod v[1:2], v[2:3], s[8:15], s[16:19] dmask:0x3 dim:SQ_RSRC_IMG_2D
  image_get_resinfo v[1:4], v2, s[8:15] dmask:0xf dim:SQ_RSRC_IMG_2D
  image_store v[1:4], v[2:4], s[8:15] dmask:0xf dim:SQ_RSRC_IMG_3D
  image_store v1, v[2:3], s[8:15] dmask:0x1 dim:SQ_RSRC_IMG_2D slc dlc
  image_store_mip v[1:2], v[2:4], s[8:15] dmask:0x3 dim:SQ_RSRC_IMG_2D
  image_atomic_add v1, v[2:3], s[8:15] dmask:0x1 dim:SQ_RSRC_IMG_2D glc
  image_atomic_cmpswap v[1:2], v[2:3], s[8:15] dmask:0x3 dim:SQ_RSRC_IMG_2D
  image_bvh_intersect_ray v[4:7], v[9:16], s[4:7] a16
  image_bvh_intersect_ray v[4:7], [v9, v10, v[11:13], v[14:16], v[17:19]], s[4:7]
  image_bvh64_intersect_ray v[4:7], [v[9:10], v11, v[12:14], v[15:17]], s[4:7] a16
  exp mrt0 v0, v1, v2, v3 done
  exp pos0 v0, off, off, off row_en
  exp mrtz v4, v5, off, off
  exp prim v1, off, off, off done
  exp dual_src_blend1 off, v2, off, v3
  v_interp_p10_f32 v0, v1, v2, v3 wait_exp:7
  v_interp_p2_f32 v0, -v1, v2, -v3 clamp wait_exp:0
  v_interp_p10_f16_f32 v10, v1.h, v2, v3.h op_sel:[1,0,1,0] wait_exp:3
  v_interp_p2_f16_f32 v10.h, -v1.h, v2, -v3 clamp wait_exp:3
  v_interp_p10_rtz_f16_f32 v5, v6.l, v7, v8.l wait_exp:1
  v_interp_p2_rtz_f16_f32 v5.l, v6.l, v7, v8 wait_exp:2
  lds_param_load v1, attr0.x wait_vdst:2
  lds_param_load v9, attr12.w wait_vdst:15
  lds_direct_load v1 wait_vdst:3
  s_endpgm
"#;
    let Some(elf) = common::assemble_raw(body, "", 0) else { return };
    compare("every encoding family", &elf);
}

/// xorshift64*: a fixed sequence, so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
}

/// `n` instructions per family with random fields under each family's fixed encoding bits
/// (mask, value), emitted as `.long` words inside the kernel and disassembled by both sides.
fn random_family(name: &str, seed: u64, n: usize, make: impl Fn(&mut Rng) -> Vec<u32>) {
    let mut rng = Rng(seed);
    let mut body = String::new();
    for _ in 0..n {
        for w in make(&mut rng) {
            body += &format!("  .long {w:#010x}\n");
        }
    }
    body += "  s_endpgm\n";
    let Some(elf) = common::assemble_raw(&body, "", 0) else { return };
    compare(name, &elf);
}

#[test]
fn random_mubuf_mtbuf_words() {
    // MUBUF: bit 16 (lds) clear; opcodes 0..0x56 (the unassigned ones are listed as .long)
    random_family("MUBUF", 1, 300, |r| {
        let w0 = 0xe000_0000 | (r.next() % 0x57) << 18 | r.next() & 0x7fff;
        let w1 = r.next() & !(1 << 31) & !(0x3 << 29);
        vec![w0, w1 & 0xfff0_ffff | (r.next() % 24) << 16]
    });
    random_family("MTBUF", 2, 300, |r| {
        let w0 = 0xe800_0000 | (r.next() & 0x03ff_ffff);
        let w1 = r.next() & !(0x7 << 29);
        vec![w0, w1 & 0xfff0_ffff | (r.next() % 24) << 16]
    });
}

#[test]
fn random_mimg_words() {
    // Opcode, dim, dmask, NSA and the flags random; registers small enough to stay in range.
    // That includes the combinations no compiler emits, for which LLVM prints the register
    // widths of the variant its decoder table matched (sampling an MSAA dimension, d16 with tfe
    // on gather4, one-address NSA, NSA resinfo).
    random_family("MIMG", 3, 1500, |r| {
        let ops = [
            0u32, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0xa, 0xb, 0xc, 0x16, 0x17, 0x18, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21,
            0x22, 0x25, 0x2b, 0x2f, 0x32, 0x37, 0x38, 0x39, 0x3c, 0x40, 0x4a, 0x55, 0x60, 0x65, 0x90,
        ];
        let op = ops[r.next() as usize % ops.len()];
        let nsa = r.next() % 3 == 0;
        let dim = r.next() % 8;
        let flags = r.next() & 0x3_f000;
        let tfe = r.next() & 3;
        let w0 = 0xf000_0000 | op << 18 | flags | (r.next() & 0xf) << 8 | (r.next() & 1) << 7 | dim << 2 | nsa as u32;
        let w1 = (r.next() % 12) << 26
            | tfe << 21
            | ((r.next() % 16) * 4 / 4) << 16
            | (r.next() % 200) << 8
            | (r.next() % 200);
        let mut v = vec![w0, w1];
        if nsa {
            // (the top byte below 0x40: when both sides list the first word as `.long`, this
            // one decodes as a plain VOP2)
            v.push(r.next() & 0x3f7f_7f7f);
        }
        v
    });
}

#[test]
fn random_exp_vinterp_ldsdir_words() {
    random_family("EXP", 4, 200, |r| vec![0xf800_0000 | (r.next() & 0x2bff), r.next() & 0x7f7f_7f7f]);
    random_family("VINTERP", 5, 200, |r| {
        let w0 = 0xcd00_0000 | (r.next() % 6) << 16 | (r.next() & 0xffff);
        let v = |r: &mut Rng| 256 + r.next() % 256;
        vec![w0, (r.next() & 7) << 29 | v(r) << 18 | v(r) << 9 | v(r)]
    });
    random_family("LDSDIR", 6, 200, |r| vec![0xce00_0000 | (r.next() % 2) << 20 | (r.next() & 0xf_ffff)]);
}

/// Words that are no gfx11 instruction are listed as objdump lists them (`.long`), and the
/// listing goes on with the next word.
#[test]
fn invalid_words_are_listed_not_refused() {
    let body = "  s_nop 0\n  .long 0xe4000000\n  .long 0xec000000\n  .long 0xe0fc0000\n  .long 0x0\n  .long 0xe8000000\n  .long 0x80010102\n  .long 0xcf000000\n  s_endpgm\n";
    let Some(elf) = common::assemble_raw(body, "", 0) else { return };
    compare("invalid words", &elf);
}

/// VOP3P with DPP16/DPP8: gfx11 has it for `v_dot2_f32_f16`, `v_dot2_f32_bf16` and the
/// `v_fma_mix*` opcodes (llvm-mc-22 rejects DPP on the other VOP3P opcodes, objdump lists
/// those words as `.long`).
#[test]
fn vop3p_dpp() {
    let body = r#"
  v_dot2_f32_f16 v0, v1, v2, v3 quad_perm:[1,0,3,2] row_mask:0xf bank_mask:0xf
  v_dot2_f32_f16 v0, v1, v2, v3 dpp8:[7,6,5,4,3,2,1,0]
  v_dot2_f32_f16 v0, v1, v2, v3 dpp8:[7,6,5,4,3,2,1,0] fi:1
  v_dot2_f32_bf16 v0, v1, v2, v3 row_shl:1 row_mask:0x3 bank_mask:0x5 bound_ctrl:1 fi:1
  v_dot2_f32_f16 v5, v1, v2, v3 op_sel:[1,0,0] op_sel_hi:[0,1,1] neg_lo:[1,0,0] neg_hi:[0,1,0] clamp row_ror:3
  v_fma_mix_f32 v0, v1, v2, v3 row_shl:1
  v_fma_mix_f32 v0, -|v1|, v2, |v3| op_sel:[1,0,0] op_sel_hi:[1,1,0] clamp row_shl:1
  v_fma_mixlo_f16 v0, v1, v2, v3 dpp8:[0,1,2,3,4,5,6,7] fi:1
  v_fma_mixhi_f16 v0, v1, v2, s3 row_mirror
  v_fma_mix_f32 v7, v8, v9, v10 row_share:3 row_mask:0x1 bank_mask:0x2
  v_dot2_f32_bf16 v9, v10, v11, v12 row_xmask:15 row_mask:0xf bank_mask:0xf
  s_endpgm
"#;
    if let Some(elf) = common::assemble_raw(body, "", 0) {
        compare("VOP3P DPP", &elf);
    }
    // the other VOP3P opcodes with a DPP src0 are words (what follows decodes on its own)
    let words = "  v_nop\n  .long 0xcc0f4000, 0x7e0202fa, 0xff00b101\n  .long 0xcc0e4000, 0x7e0202e9, 0x05397701\n  .long 0xcc404000, 0x7e0202ea, 0x05397701\n  .long 0xcc164000, 0x7e0202fa, 0xff00b101\n  s_endpgm\n";
    if let Some(elf) = common::assemble_raw(words, "", 0) {
        compare("VOP3P DPP on opcodes without a DPP form", &elf);
    }
    // random fields; src1/src2 VGPRs or SGPRs (an SGPR src1 of fma_mix is printed with a complaint).
    // Left out: v_fma_mix* DPP16 quad_perm with bits 7:6 of the control set, which
    // llvm-objdump-22 prints altered (bit 7 dropped, or "Invalid dpp_ctrl" with op_sel set).
    random_family("VOP3P DPP", 7, 400, |r| {
        let ops = [19u32, 26, 32, 33, 34];
        let op = ops[r.next() as usize % ops.len()];
        let w0 = 0xcc00_0000 | op << 16 | (r.next() & 0xffff);
        let s = |r: &mut Rng| if r.next().is_multiple_of(4) { r.next() % 106 } else { 256 + r.next() % 256 };
        let src0 = [0xfa, 0xe9, 0xea][r.next() as usize % 3];
        let w1 = (r.next() & 0xf800_0000) | s(r) << 18 | s(r) << 9 | src0;
        let mut w2 = r.next();
        if op >= 32 && src0 == 0xfa && w2 & 0x1_0000 == 0 {
            w2 &= !0xc000;
        }
        vec![w0, w1, w2]
    });
}

/// DS with and without the GDS bit: random opcodes and offsets, register fields random where
/// the opcode uses them and zero where it does not (LLVM lists a word with a stray field as
/// `.long`), plus some words with stray fields.
#[test]
fn ds_gds() {
    let body = r#"
  ds_add_u32 v1, v2 gds
  ds_load_b32 v1, v2 offset:8 gds
  ds_store_b32 v1, v2 gds
  ds_append v1 gds
  ds_consume v1 offset:4 gds
  ds_append v1
  ds_add_rtn_u32 v1, v2, v3 gds
  ds_load_2addr_b32 v[1:2], v2 offset0:1 offset1:2 gds
  ds_swizzle_b32 v1, v2 offset:swizzle(SWAP,16) gds
  ds_nop
  ds_gws_init v1 gds
  ds_gws_barrier v1 offset:4 gds
  ds_gws_sema_v gds
  ds_gws_sema_br v1 gds
  ds_gws_sema_p gds
  ds_gws_sema_release_all offset:8 gds
  ds_ordered_count v1, v2 offset:4 gds
  ds_add_gs_reg_rtn v[2:3], v1 offset:16 gds
  ds_sub_gs_reg_rtn v[2:3], v1 gds
  .long 0xd8000010, 0x00040302
  .long 0xd8020010, 0x05000302
  .long 0xd8520000, 0x02000100
  .long 0xd8660000, 0x02000100
  .long 0xd9e80000, 0x02000100
  .long 0xdab60000, 0x02000100
  s_endpgm
"#;
    if let Some(elf) = common::assemble_raw(body, "", 0) {
        compare("DS gds", &elf);
    }
    // each register field zero half the time (so most opcodes meet their clean form); addr
    // below 200, data0 even and vdst below 64, so a word listed as `.long` leaves a second word
    // that decodes as a plain VOP2
    random_family("DS", 8, 600, |r| {
        let op = r.next() % 256;
        let w0 = 0xd800_0000 | op << 18 | (r.next() & 1) << 17 | (r.next() & 0xffff);
        let f = |r: &mut Rng, n: u32, step: u32| if r.next() & 1 == 0 { 0 } else { r.next() % n * step };
        let (addr, data0, data1, vdst) = (f(r, 200, 1), f(r, 128, 2), f(r, 256, 1), f(r, 64, 1));
        let w1 = addr | data0 << 8 | data1 << 16 | vdst << 24;
        vec![w0, w1]
    });
}
