//! `strata generate|bench --spec N --mtp HEAD` on the software device; the same commands on the
//! CPU, and the helpers used here: cli/cli_mtp.rs.

use crate::cli::cli_mtp::{PROMPT, acc, run_ok, shown_ids, tmp};

/// `--device emu --spec N --mtp HEAD`: the head runs on the software device next to the trunk;
/// the ids equal the device's plain greedy ids, the echo head's drafts are accepted as on the
/// CPU, and `bench` reports the MTP drafter there too.
#[test]
fn cli_mtp_on_emu_drafts_on_the_device() {
    let prefix = tmp("emu-tiny");
    let (out, _) = run_ok(&[
        "synth",
        "--out",
        prefix.to_str().unwrap(),
        "--preset",
        "tiny",
        "--tied",
        "--mtp-head",
        "echo",
        "--seed",
        "3",
    ]);
    let files: Vec<&str> = out.lines().collect();
    let (model, echo) = (files[0].to_string(), files.last().unwrap().to_string());
    assert!(echo.ends_with("-mtp.gguf"), "{out}");
    let generate = |extra: &[&str]| {
        let mut a =
            vec!["generate", "-m", &model, "--tokens", PROMPT, "-n", "24", "--temp", "0", "--show-ids", "-t", "2"];
        a.extend_from_slice(extra);
        run_ok(&a).1
    };
    let plain = shown_ids(&generate(&["--device", "emu"]));
    let cpu = generate(&["--spec", "4", "--mtp", &echo]);
    for n in ["1", "4", "8"] {
        let err = generate(&["--device", "emu", "--spec", n, "--mtp", &echo]);
        assert_eq!(shown_ids(&err), plain, "--spec {n}: ids differ from the device's plain greedy ids\n{err}");
        assert!(err.contains("MTP drafter"), "{err}");
        let (a, d) = acc(&err);
        assert!(a > 0 && d >= a, "--spec {n}: {a}/{d}");
        if n == "4" {
            assert_eq!(shown_ids(&cpu), plain, "the CPU's ids");
            assert_eq!(acc(&cpu), (a, d), "the CPU head's acceptance\n{cpu}\n{err}");
        }
    }
    let (out, _) = run_ok(&[
        "bench", "-m", &model, "--device", "emu", "--pp", "16", "--tg", "16", "--reps", "1", "--spec", "4", "--mtp",
        &echo, "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["spec"]["drafter"], "MTP", "{out}");
    assert!(j["spec"]["tokens_per_verify"].as_f64().unwrap() > 1.0, "{out}");
}
