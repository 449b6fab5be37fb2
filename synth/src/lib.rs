//! Writers of synthetic (random-weight) model files for tests, benchmarks and demos, kept out
//! of the model descriptions they exercise. The shared-decoder fixtures are written by
//! `scripts/make-testdata.sh` (Python, with the `gguf` package, byte-identical to the files
//! llama.cpp's references were recorded on); Flash-Next's by [`qwen4exp`] (`strata synth`).

pub mod qwen4exp;

use quant::GgmlType;
use rng::SplitMix64;

/// `nblocks` random blocks of `ty` (Q8_0, Q4_K, Q6_K, IQ3_XXS, IQ4_NL): random quant bytes,
/// each f16 block scale set to `scale(rng, i)` for the type's scale `i` (Q4_K: 0 = d, 1 = dmin),
/// so every bit pattern of the quants is exercised with finite, chosen magnitudes. None for
/// another type.
pub fn random_blocks(
    ty: GgmlType,
    nblocks: usize,
    rng: &mut SplitMix64,
    mut scale: impl FnMut(&mut SplitMix64, usize) -> f32,
) -> Option<Vec<u8>> {
    // (block bytes, offsets of the f16 scales)
    let (bb, offsets): (usize, &[usize]) = match ty {
        GgmlType::Q8_0 | GgmlType::IQ3XXS | GgmlType::IQ4NL => {
            (ty.row_bytes(ty.block_size()).expect("a block type"), &[0])
        }
        GgmlType::Q4K => (144, &[0, 2]),
        GgmlType::Q6K => (210, &[208]),
        _ => return None,
    };
    // One draw per byte (the kernel tests' weights depend on this sequence).
    let mut v: Vec<u8> = (0..nblocks * bb).map(|_| rng.next_u64() as u8).collect();
    for b in v.chunks_exact_mut(bb) {
        for (i, &o) in offsets.iter().enumerate() {
            b[o..o + 2].copy_from_slice(&quant::f32_to_f16(scale(rng, i)).to_le_bytes());
        }
    }
    Some(v)
}
