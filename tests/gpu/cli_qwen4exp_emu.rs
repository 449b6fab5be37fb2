//! The Flash-Next (qwen4exp) fixtures through the binary on the software device; the same on
//! the CPU, and the helpers used here: cli/cli_qwen4exp.rs.

use crate::cli::cli_qwen4exp::{F32, csv, ref_seq, run_ok, seq1_max_logit_diff, shown_ids};
use crate::models::models_util::reference;
use crate::support::strata_out as strata;

/// On the software device (`--device emu`, the gfx11 kernels): `strata logits` is within the
/// CPU backend's tolerance of llama.cpp's logits (1e-3 with f16 caches), `strata generate
/// --temp 0` prints llama.cpp's greedy ids (`--ordered` there: tests/gpu/cli_ordered.rs).
#[test]
fn cli_qwen4exp_on_emu_matches_llama_cpp() {
    let d = seq1_max_logit_diff("f32", &["--device", "emu"]);
    assert!(d <= 1e-3, "--device emu: max |logit diff| {d}");
    let m = reference(F32);
    let (toks, greedy) = ref_seq("f32", 0);
    let n = greedy.len().to_string();
    let (_, err) = run_ok(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "--device",
        "emu",
        "--tokens",
        &csv(&toks),
        "-n",
        &n,
        "--temp",
        "0",
        "--show-ids",
    ]);
    let got = shown_ids(&err);
    assert_eq!(got[..], greedy[..got.len()], "{err}");
    assert!(got.len() == greedy.len() || err.contains("stop: Eog"), "{err}");
    // --spec on the device equals plain greedy; a model without a NextN block as the MTP head
    // is refused there with the reason, as on the CPU (tests/cli/cli_mtp.rs runs real heads).
    let (_, err) = run_ok(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "--device",
        "emu",
        "--tokens",
        &csv(&toks),
        "-n",
        &n,
        "--temp",
        "0",
        "--show-ids",
        "--spec",
        "4",
    ]);
    assert_eq!(shown_ids(&err)[..], got[..], "{err}");
    let out = strata(&[
        "generate",
        "-m",
        m.to_str().unwrap(),
        "--device",
        "emu",
        "-p",
        "hi",
        "-n",
        "2",
        "--temp",
        "0",
        "--spec",
        "2",
        "--mtp",
        m.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("MTP head") && !err.contains("panicked"), "{err}");
}
