//! Opcode names of the gfx11 resource encodings (MUBUF, MTBUF, MIMG) and their printed
//! constants (MTBUF unified formats), read off llvm-mc-22's disassembly of every opcode.
//! Kept apart from `optable.rs` (VALU/SALU/DS/FLAT) because these encodings carry no operand
//! shapes: their register widths follow from the name, dmask, d16 and tfe (see `resource.rs`).

/// MUBUF opcodes (bits 25:18), including the cache invalidations 0x2b/0x2c.
pub static MUBUF: &[(u8, &str)] = &[
    (0x00, "buffer_load_format_x"), (0x01, "buffer_load_format_xy"), (0x02, "buffer_load_format_xyz"),
    (0x03, "buffer_load_format_xyzw"), (0x04, "buffer_store_format_x"), (0x05, "buffer_store_format_xy"),
    (0x06, "buffer_store_format_xyz"), (0x07, "buffer_store_format_xyzw"), (0x08, "buffer_load_d16_format_x"),
    (0x09, "buffer_load_d16_format_xy"), (0x0a, "buffer_load_d16_format_xyz"),
    (0x0b, "buffer_load_d16_format_xyzw"), (0x0c, "buffer_store_d16_format_x"),
    (0x0d, "buffer_store_d16_format_xy"), (0x0e, "buffer_store_d16_format_xyz"),
    (0x0f, "buffer_store_d16_format_xyzw"), (0x10, "buffer_load_u8"), (0x11, "buffer_load_i8"),
    (0x12, "buffer_load_u16"), (0x13, "buffer_load_i16"), (0x14, "buffer_load_b32"),
    (0x15, "buffer_load_b64"), (0x16, "buffer_load_b96"), (0x17, "buffer_load_b128"),
    (0x18, "buffer_store_b8"), (0x19, "buffer_store_b16"), (0x1a, "buffer_store_b32"),
    (0x1b, "buffer_store_b64"), (0x1c, "buffer_store_b96"), (0x1d, "buffer_store_b128"),
    (0x1e, "buffer_load_d16_u8"), (0x1f, "buffer_load_d16_i8"), (0x20, "buffer_load_d16_b16"),
    (0x21, "buffer_load_d16_hi_u8"), (0x22, "buffer_load_d16_hi_i8"), (0x23, "buffer_load_d16_hi_b16"),
    (0x24, "buffer_store_d16_hi_b8"), (0x25, "buffer_store_d16_hi_b16"),
    (0x26, "buffer_load_d16_hi_format_x"), (0x27, "buffer_store_d16_hi_format_x"), (0x2b, "buffer_gl0_inv"),
    (0x2c, "buffer_gl1_inv"), (0x33, "buffer_atomic_swap_b32"), (0x34, "buffer_atomic_cmpswap_b32"),
    (0x35, "buffer_atomic_add_u32"), (0x36, "buffer_atomic_sub_u32"), (0x37, "buffer_atomic_csub_u32"),
    (0x38, "buffer_atomic_min_i32"), (0x39, "buffer_atomic_min_u32"), (0x3a, "buffer_atomic_max_i32"),
    (0x3b, "buffer_atomic_max_u32"), (0x3c, "buffer_atomic_and_b32"), (0x3d, "buffer_atomic_or_b32"),
    (0x3e, "buffer_atomic_xor_b32"), (0x3f, "buffer_atomic_inc_u32"), (0x40, "buffer_atomic_dec_u32"),
    (0x41, "buffer_atomic_swap_b64"), (0x42, "buffer_atomic_cmpswap_b64"), (0x43, "buffer_atomic_add_u64"),
    (0x44, "buffer_atomic_sub_u64"), (0x45, "buffer_atomic_min_i64"), (0x46, "buffer_atomic_min_u64"),
    (0x47, "buffer_atomic_max_i64"), (0x48, "buffer_atomic_max_u64"), (0x49, "buffer_atomic_and_b64"),
    (0x4a, "buffer_atomic_or_b64"), (0x4b, "buffer_atomic_xor_b64"), (0x4c, "buffer_atomic_inc_u64"),
    (0x4d, "buffer_atomic_dec_u64"), (0x50, "buffer_atomic_cmpswap_f32"), (0x51, "buffer_atomic_min_f32"),
    (0x52, "buffer_atomic_max_f32"), (0x56, "buffer_atomic_add_f32"),
];

/// MIMG opcodes (bits 25:18).
pub static MIMG: &[(u8, &str)] = &[
    (0x00, "image_load"), (0x01, "image_load_mip"), (0x02, "image_load_pck"), (0x03, "image_load_pck_sgn"),
    (0x04, "image_load_mip_pck"), (0x05, "image_load_mip_pck_sgn"), (0x06, "image_store"),
    (0x07, "image_store_mip"), (0x08, "image_store_pck"), (0x09, "image_store_mip_pck"),
    (0x0a, "image_atomic_swap"), (0x0b, "image_atomic_cmpswap"), (0x0c, "image_atomic_add"),
    (0x0d, "image_atomic_sub"), (0x0e, "image_atomic_smin"), (0x0f, "image_atomic_umin"),
    (0x10, "image_atomic_smax"), (0x11, "image_atomic_umax"), (0x12, "image_atomic_and"),
    (0x13, "image_atomic_or"), (0x14, "image_atomic_xor"), (0x15, "image_atomic_inc"),
    (0x16, "image_atomic_dec"), (0x17, "image_get_resinfo"), (0x18, "image_msaa_load"),
    (0x19, "image_bvh_intersect_ray"), (0x1a, "image_bvh64_intersect_ray"), (0x1b, "image_sample"),
    (0x1c, "image_sample_d"), (0x1d, "image_sample_l"), (0x1e, "image_sample_b"), (0x1f, "image_sample_lz"),
    (0x20, "image_sample_c"), (0x21, "image_sample_c_d"), (0x22, "image_sample_c_l"),
    (0x23, "image_sample_c_b"), (0x24, "image_sample_c_lz"), (0x25, "image_sample_o"),
    (0x26, "image_sample_d_o"), (0x27, "image_sample_l_o"), (0x28, "image_sample_b_o"),
    (0x29, "image_sample_lz_o"), (0x2a, "image_sample_c_o"), (0x2b, "image_sample_c_d_o"),
    (0x2c, "image_sample_c_l_o"), (0x2d, "image_sample_c_b_o"), (0x2e, "image_sample_c_lz_o"),
    (0x2f, "image_gather4"), (0x30, "image_gather4_l"), (0x31, "image_gather4_b"), (0x32, "image_gather4_lz"),
    (0x33, "image_gather4_c"), (0x34, "image_gather4_c_lz"), (0x35, "image_gather4_o"),
    (0x36, "image_gather4_lz_o"), (0x37, "image_gather4_c_lz_o"), (0x38, "image_get_lod"),
    (0x39, "image_sample_d_g16"), (0x3a, "image_sample_c_d_g16"), (0x3b, "image_sample_d_o_g16"),
    (0x3c, "image_sample_c_d_o_g16"), (0x40, "image_sample_cl"), (0x41, "image_sample_d_cl"),
    (0x42, "image_sample_b_cl"), (0x43, "image_sample_c_cl"), (0x44, "image_sample_c_d_cl"),
    (0x45, "image_sample_c_b_cl"), (0x46, "image_sample_cl_o"), (0x47, "image_sample_d_cl_o"),
    (0x48, "image_sample_b_cl_o"), (0x49, "image_sample_c_cl_o"), (0x4a, "image_sample_c_d_cl_o"),
    (0x4b, "image_sample_c_b_cl_o"), (0x54, "image_sample_c_d_cl_g16"), (0x55, "image_sample_d_cl_o_g16"),
    (0x56, "image_sample_c_d_cl_o_g16"), (0x5f, "image_sample_d_cl_g16"), (0x60, "image_gather4_cl"),
    (0x61, "image_gather4_b_cl"), (0x62, "image_gather4_c_cl"), (0x63, "image_gather4_c_l"),
    (0x64, "image_gather4_c_b"), (0x65, "image_gather4_c_b_cl"), (0x90, "image_gather4h"),
];

/// MTBUF unified formats 0..63 (bits 25:19) as `format:[...]` prints them; 1 is the default
/// (not printed), 64+ print as a number.
pub static UFMT: [&str; 64] = [
    "BUF_FMT_INVALID", "BUF_FMT_8_UNORM", "BUF_FMT_8_SNORM", "BUF_FMT_8_USCALED", "BUF_FMT_8_SSCALED", "BUF_FMT_8_UINT",
    "BUF_FMT_8_SINT", "BUF_FMT_16_UNORM", "BUF_FMT_16_SNORM", "BUF_FMT_16_USCALED", "BUF_FMT_16_SSCALED",
    "BUF_FMT_16_UINT", "BUF_FMT_16_SINT", "BUF_FMT_16_FLOAT", "BUF_FMT_8_8_UNORM", "BUF_FMT_8_8_SNORM",
    "BUF_FMT_8_8_USCALED", "BUF_FMT_8_8_SSCALED", "BUF_FMT_8_8_UINT", "BUF_FMT_8_8_SINT", "BUF_FMT_32_UINT",
    "BUF_FMT_32_SINT", "BUF_FMT_32_FLOAT", "BUF_FMT_16_16_UNORM", "BUF_FMT_16_16_SNORM",
    "BUF_FMT_16_16_USCALED", "BUF_FMT_16_16_SSCALED", "BUF_FMT_16_16_UINT", "BUF_FMT_16_16_SINT",
    "BUF_FMT_16_16_FLOAT", "BUF_FMT_10_11_11_FLOAT", "BUF_FMT_11_11_10_FLOAT", "BUF_FMT_10_10_10_2_UNORM",
    "BUF_FMT_10_10_10_2_SNORM", "BUF_FMT_10_10_10_2_UINT", "BUF_FMT_10_10_10_2_SINT",
    "BUF_FMT_2_10_10_10_UNORM", "BUF_FMT_2_10_10_10_SNORM", "BUF_FMT_2_10_10_10_USCALED",
    "BUF_FMT_2_10_10_10_SSCALED", "BUF_FMT_2_10_10_10_UINT", "BUF_FMT_2_10_10_10_SINT",
    "BUF_FMT_8_8_8_8_UNORM", "BUF_FMT_8_8_8_8_SNORM", "BUF_FMT_8_8_8_8_USCALED", "BUF_FMT_8_8_8_8_SSCALED",
    "BUF_FMT_8_8_8_8_UINT", "BUF_FMT_8_8_8_8_SINT", "BUF_FMT_32_32_UINT", "BUF_FMT_32_32_SINT",
    "BUF_FMT_32_32_FLOAT", "BUF_FMT_16_16_16_16_UNORM", "BUF_FMT_16_16_16_16_SNORM",
    "BUF_FMT_16_16_16_16_USCALED", "BUF_FMT_16_16_16_16_SSCALED", "BUF_FMT_16_16_16_16_UINT",
    "BUF_FMT_16_16_16_16_SINT", "BUF_FMT_16_16_16_16_FLOAT", "BUF_FMT_32_32_32_UINT", "BUF_FMT_32_32_32_SINT",
    "BUF_FMT_32_32_32_FLOAT", "BUF_FMT_32_32_32_32_UINT", "BUF_FMT_32_32_32_32_SINT",
    "BUF_FMT_32_32_32_32_FLOAT",
];
