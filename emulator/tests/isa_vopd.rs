//! VOPD dual issue: both halves read their sources before either writes. (Operands obey the
//! VGPR bank rules: X and Y sources in different banks, destinations of opposite parity.)
mod common;
use common::*;

const COPY: &str = "v_mov_b32 v8, v2\n v_mov_b32 v9, v3\n v_mov_b32 v10, v2\n v_mov_b32 v11, v3\n";

#[test]
fn dual_ops() {
    let i = abc(|l| f(l as f32), |l| f(2.0 + l as f32), |_| 0);
    let Some(out) =
        run(&format!("{COPY} v_dual_mul_f32 v5, v8, v9 :: v_dual_add_f32 v6, v10, v11\n v_sub_f32 v5, v5, v6"), &i)
    else {
        return;
    };
    for l in 0..32 {
        let (a, b) = (l as f32, 2.0 + l as f32);
        assert_eq!(ff(out[l]), a * b - (a + b), "lane {l}");
    }
    // Y reads v8, which X overwrites: Y must see the old value
    let Some(out) = run(&format!("{COPY} v_dual_mov_b32 v8, v9 :: v_dual_add_f32 v5, v8, v8"), &i) else { return };
    for l in 0..32 {
        assert_eq!(ff(out[l]), 2.0 * l as f32, "lane {l}");
    }
    let Some(out) = run(
        &format!(
            "{COPY} v_mov_b32 v5, 1.0\n v_dual_fmaak_f32 v6, v8, v9, 0x3f000000 :: v_dual_fmac_f32 v5, v10, v11\n v_add_f32 v5, v5, v6"
        ),
        &i,
    ) else {
        return;
    };
    for l in 0..32 {
        let (a, b) = (l as f32, 2.0 + l as f32);
        assert_eq!(ff(out[l]), a.mul_add(b, 1.0) + a.mul_add(b, 0.5), "lane {l}");
    }
}
