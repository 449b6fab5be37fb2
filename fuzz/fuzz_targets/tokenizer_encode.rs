//! Arbitrary text through the tokenizers of real vocabularies (strata_fuzz::vocabularies:
//! tiny BPE always, Gemma 3 SPM / Qwen2.5 BPE / SmolLM2 BPE when cached), and arbitrary ids
//! back through decode. Properties: no panic; every id is in the vocabulary; without BOS the
//! tokens' bytes spell the text exactly (byte-level BPE and SPM with byte fallback lose
//! nothing; left out: texts holding a byte the vocabulary has no token for, which llama.cpp
//! drops too, SPM texts holding U+2581, which the escaping cannot tell from a space, and SPM
//! vocabularies that add a space prefix); every pre-tokenizer's split is a partition of its
//! input.
//!
//! Input: `[flags] [text bytes]` (lossy UTF-8); flags bits 0-1 pick the vocabulary, bit 2
//! add_bos, bit 3 parse_special, bits 4-6 the pre-tokenizer whose split is checked. The same
//! text bytes, read as u32 LE, are the ids decoded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenizer::PreTokenizer;

const PRE: [PreTokenizer; 5] =
    [PreTokenizer::Default, PreTokenizer::Gpt2, PreTokenizer::Llama3, PreTokenizer::Qwen2, PreTokenizer::Starcoder];

// The fixtures (vocabularies) load before the first input, so their one-time cost (seconds
// under ASan, more on a busy machine) is not counted against that input's -timeout.
fuzz_target!(init: { strata_fuzz::vocabularies(); }, |data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else { return };
    let vocabs = strata_fuzz::vocabularies();
    let named = &vocabs[(flags & 3) as usize % vocabs.len()];
    let t = &named.tok;
    let (add_bos, parse_special) = (flags & 4 != 0, flags & 8 != 0);
    let text = String::from_utf8_lossy(rest);

    let pre = PRE[((flags >> 4) & 7) as usize % PRE.len()];
    let words = pre.split(&text);
    assert_eq!(words.concat(), text, "{pre:?} split is not a partition of its input");

    let n = t.vocab_size();
    let ids = t.encode(&text, add_bos, parse_special);
    assert!(ids.iter().all(|&i| (i as usize) < n), "{}: id out of range in {ids:?}", named.name);
    let spm_lossy = t.model_name() == "spm" && (text.contains('\u{2581}') || spm_adds_space(t));
    let spellable = !text.bytes().any(|b| named.unspellable[b as usize]);
    if !add_bos && !spm_lossy && spellable {
        let bytes: Vec<u8> = ids.iter().flat_map(|&i| t.token_to_bytes(i)).collect();
        assert!(
            bytes == text.as_bytes(),
            "{}: tokens {ids:?} spell {:?}, not the input {text:?}",
            named.name,
            String::from_utf8_lossy(&bytes)
        );
    }
    let _ = (t.decode(&ids), t.decode_with(&ids, false));

    // Arbitrary ids, some outside the vocabulary.
    let raw: Vec<u32> = rest
        .chunks(4)
        .map(|c| {
            let mut b = [0u8; 4];
            b[..c.len()].copy_from_slice(c);
            u32::from_le_bytes(b) % (n as u32 + 8)
        })
        .collect();
    let _ = (t.decode(&raw), t.decode_with(&raw, false));
    for &i in raw.iter().take(64) {
        let _ = (t.token_to_bytes(i), t.token_text(i), t.is_eog(i), t.is_control(i));
    }
});

/// Whether an SPM vocabulary prepends "▁" to text (Llama 2 style): then the first token's
/// bytes start with a space the input did not have.
fn spm_adds_space(t: &tokenizer::Tokenizer) -> bool {
    t.encode("a", false, false).first().is_some_and(|&i| t.token_to_bytes(i).first() == Some(&b' '))
}
