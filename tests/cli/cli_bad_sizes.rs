//! Issue 39's failures from outside, end to end through the `strata` binary: sizes from a
//! file or a flag that reached an allocation unchecked (a block count of 2^32-1, a context of
//! 10^8 or 2^64-1 positions, 100000 threads), a NaN norm weight that changed the answer
//! silently, and the weak answers made precise (negative flag values, an empty prompt, a
//! shape that follows a wrong embedding width). Each test fails on the code before the fix.

use std::time::{Duration, Instant};

use gguf::Value;

use crate::cli::cli_bad_input::{fails, fails_gen, fixture, rewrite};
use crate::support::strata_cmd as strata;

#[test]
fn block_count_of_2_pow_32_minus_1_is_refused_before_any_allocation() {
    let p = rewrite("blocks-u32-max.gguf", &[("qwen3moe.block_count", Some(Value::U32(u32::MAX)))], |_, _, _| {});
    let want = "metadata 'qwen3moe.block_count': 4294967295 layers, but the file's tensors describe 2 (blk.0 .. blk.1)";
    let err = fails_gen(&p, "1,2");
    assert!(err.contains(want) && !err.contains("memory allocation"), "{err}");
    // --serve loads the same way: it exits with the reason before its hello.
    let o = strata().args(["--serve", "-m", p.to_str().unwrap()]).output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(want), "{stderr}");
    // `gguf --check` runs the load's validation: the file is well-formed GGUF, but no model.
    let o = strata().args(["gguf", "--check", p.to_str().unwrap()]).output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("well-formed GGUF, but the engine refuses it") && stdout.contains(want), "{stdout}");
}

#[test]
fn a_context_that_does_not_fit_is_refused_with_the_numbers() {
    let m = fixture();
    let m = m.to_str().unwrap();
    // 2 layers x K and V x 2 KV heads x 64 values x 2 bytes = 1024 bytes a position (f16).
    let err = fails(&["generate", "-m", m, "--tokens", "1,2", "-n", "1", "--max-context", "100000000"]);
    assert!(
        err.contains("--max-context 100000000 does not fit: the KV cache needs 102.4 GB (1.0 KB a position, --kv f16)"),
        "{err}"
    );
    assert!(
        err.contains("of memory is available; at most")
            && err.contains("positions fit (lower --max-context or --kv int8)"),
        "{err}"
    );
    let err = fails(&["generate", "-m", m, "--tokens", "1,2", "-n", "1", "--max-context", "18446744073709551615"]);
    assert!(err.contains("--max-context 18446744073709551615: the KV cache's size overflows"), "{err}");
    assert!(!err.contains("capacity overflow") && !err.contains("panicked"), "{err}");
    // The same plan holds for --serve, which refuses before its hello.
    let o = strata().args(["--serve", "-m", m, "--max-context", "100000000"]).output().unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("does not fit"), "{o:?}");
    assert!(o.stdout.is_empty(), "no hello: {o:?}");
}

#[test]
fn threads_far_beyond_the_cores_are_refused_at_once() {
    let t0 = Instant::now();
    let err =
        fails(&["generate", "-m", fixture().to_str().unwrap(), "--tokens", "1", "-n", "1", "--threads", "100000"]);
    assert!(err.contains("--threads 100000 is more than") && err.contains("per usable CPU"), "{err}");
    // Before the fix it started 100000 threads and printed nothing for 45 s.
    assert!(t0.elapsed() < Duration::from_secs(20), "took {:?}", t0.elapsed());
}

#[test]
fn a_nan_norm_weight_is_an_error_naming_the_tensor() {
    // output_norm.weight is f32: its first value made NaN.
    let p = rewrite("nan-output-norm.gguf", &[], |name, _, d| {
        if name == "output_norm.weight" {
            d[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        }
    });
    let err = fails_gen(&p, "1,2");
    assert!(
        err.contains(
            "tensor 'output_norm.weight': value 0 is NaN (norm weights, biases and scales must be finite numbers)"
        ),
        "{err}"
    );
    let p = rewrite("inf-attn-norm.gguf", &[], |name, _, d| {
        if name == "blk.1.attn_norm.weight" {
            d[12..16].copy_from_slice(&f32::INFINITY.to_le_bytes());
        }
    });
    let err = fails_gen(&p, "1,2");
    assert!(err.contains("tensor 'blk.1.attn_norm.weight': value 3 is inf"), "{err}");
}

#[test]
fn negative_flag_values_say_what_the_option_takes() {
    let o = strata().args(["generate", "-m", fixture().to_str().unwrap(), "-n", "-1"]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("invalid value '-1'")
            && err.contains("a negative number, but this option takes a whole number >= 0"),
        "{err}"
    );
    assert!(!err.contains("unexpected argument"), "{err}");
}

#[test]
fn an_empty_prompt_says_why_there_is_nothing_to_evaluate() {
    let err = fails(&["generate", "-m", fixture().to_str().unwrap(), "-p", "", "-n", "1"]);
    assert!(err.contains("the prompt is empty and this model adds no BOS token: nothing to evaluate"), "{err}");
}

#[test]
fn a_wrong_embedding_width_names_the_shape_it_expected() {
    let p = rewrite("embd-512.gguf", &[("qwen3moe.embedding_length", Some(Value::U32(512)))], |_, _, _| {});
    let err = fails_gen(&p, "1,2");
    assert!(err.contains("tensor 'token_embd.weight': shape [256, 1024], expected [512, *] (its dimensions follow the metadata: embedding_length"), "{err}");
}
