//! `strata synth --mtp-head` and `--spec N --mtp PATH` through the binary: the written model and
//! head load, speculative ids equal plain greedy ids (echo head: accepted drafts; random head:
//! rejected ones), a directory works as the path, `bench` reports the MTP drafter's
//! acceptance and tokens per verify step, and bad paths/files/flag combinations fail with a
//! message naming the problem.

use crate::support::strata_out as strata;
use std::path::PathBuf;

pub(crate) fn run_ok(args: &[&str]) -> (String, String) {
    let out = strata(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "strata {args:?} failed: {err}");
    (String::from_utf8(out.stdout).expect("utf-8 stdout"), err)
}

fn run_err(args: &[&str]) -> String {
    let out = strata(args);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "strata {args:?} succeeded: {err}");
    assert!(!err.contains("panicked"), "strata {args:?} panicked: {err}");
    err
}

pub(crate) fn tmp(name: &str) -> PathBuf {
    crate::support::scratch_dir("cli-mtp").join(name)
}

pub(crate) fn shown_ids(stderr: &str) -> Vec<u32> {
    let line =
        stderr.lines().find_map(|l| l.strip_prefix("ids: ")).unwrap_or_else(|| panic!("no ids line in {stderr}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("ids line {line:?}: {e}"))
}

/// (accepted, drafted) from the `acceptance x% (a/b drafts)` summary.
pub(crate) fn acc(err: &str) -> (u64, u64) {
    let s = err
        .split(" drafts)")
        .next()
        .and_then(|s| s.rsplit('(').next())
        .unwrap_or_else(|| panic!("no summary in {err}"));
    let (a, b) = s.split_once('/').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

/// The tokens `strata --serve [extra]` streams for one request of [`PROMPT`] (24 tokens, no stop
/// tokens, `sampling`), and its done line.
fn serve(model: &str, extra: &[&str], sampling: &serde_json::Value) -> (Vec<u32>, serde_json::Value) {
    serve_with(&[&["-m", model], extra].concat(), sampling)
}

/// [`serve`] with the whole engine command line given (`args`, without `--serve`).
fn serve_with(extra: &[&str], sampling: &serde_json::Value) -> (Vec<u32>, serde_json::Value) {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["--serve", "-t", "2"])
        .args(extra)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting strata --serve");
    let tokens: Vec<u32> = PROMPT.split(',').map(|t| t.parse().unwrap()).collect();
    let req = serde_json::json!({"type": "generate", "id": 1, "tokens": tokens, "max_tokens": 24,
        "sampling": sampling, "stop_tokens": []});
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{req}").unwrap();
    drop(stdin); // EOF: the engine finishes the request, then exits
    let out = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "--serve {extra:?}: {text}\n{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let ids = lines.iter().filter(|v| v["type"] == "token").map(|v| v["token"].as_u64().unwrap() as u32).collect();
    let done = lines.iter().find(|v| v["type"] == "done").unwrap_or_else(|| panic!("no done line: {text}")).clone();
    (ids, done)
}

pub(crate) const PROMPT: &str = "5,42,79,116,153,190,227,264,5,42,79,116";

#[test]
fn cli_mtp_synth_generate_bench_and_errors() {
    let prefix = tmp("tiny");
    let pre = prefix.to_str().unwrap();
    let (out, _) = run_ok(&[
        "synth",
        "--out",
        pre,
        "--preset",
        "tiny",
        "--tied",
        "--type",
        "q8_0",
        "--split-ple",
        "--mtp-head",
        "echo",
        "--seed",
        "3",
    ]);
    let files: Vec<&str> = out.lines().collect();
    assert_eq!(files.len(), 3, "{out}");
    let (model, echo) = (files[0].to_string(), files[2].to_string());
    assert!(model.ends_with("-00001-of-00002.gguf") && echo.ends_with("tiny-mtp.gguf"), "{out}");
    let rnd_prefix = tmp("tiny-random");
    run_ok(&[
        "synth",
        "--out",
        rnd_prefix.to_str().unwrap(),
        "--preset",
        "tiny",
        "--tied",
        "--type",
        "q8_0",
        "--split-ple",
        "--mtp-head",
        "random",
        "--mtp-ratio",
        "2",
        "--mtp-own-tables",
        "--seed",
        "3",
    ]);
    let random = format!("{}-mtp.gguf", rnd_prefix.display());
    // The same seed and shape: the trunks are identical, so the random head fits `model` too.

    let generate = |extra: &[&str]| {
        let mut a =
            vec!["generate", "-m", &model, "--tokens", PROMPT, "-n", "24", "--temp", "0", "--show-ids", "-t", "2"];
        a.extend_from_slice(extra);
        run_ok(&a).1
    };
    let plain = shown_ids(&generate(&[]));
    assert_eq!(plain.len(), 24);
    let err = generate(&["--spec", "4", "--mtp", &echo]);
    assert_eq!(shown_ids(&err), plain, "echo head: ids differ");
    assert!(err.contains("MTP drafter"), "{err}");
    let (a, d) = acc(&err);
    assert!(a > 0 && d >= a, "echo head: {a}/{d}");
    let err = generate(&["--spec", "3", "--spec-min-p", "0.2", "--mtp", &random]);
    assert_eq!(shown_ids(&err), plain, "random head: ids differ");
    let (a, d) = acc(&err);
    assert!(d > a, "random head accepted everything: {a}/{d}");
    // A directory holding the head.
    let dir = tmp("head-dir");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(&echo, dir.join("mtp.gguf")).unwrap();
    let err = generate(&["--spec", "8", "--mtp", dir.to_str().unwrap()]);
    assert_eq!(shown_ids(&err), plain, "directory head: ids differ");
    // Sampled (`--temp > 0`): speculative sampling with drafts verified, reproducible from the
    // seed.
    let sampled_gen = || {
        run_ok(&[
            "generate",
            "-m",
            &model,
            "--tokens",
            PROMPT,
            "-n",
            "24",
            "--temp",
            "0.9",
            "--seed",
            "7",
            "--show-ids",
            "-t",
            "2",
            "--spec",
            "4",
            "--mtp",
            &echo,
        ])
        .1
    };
    let err = sampled_gen();
    assert!(err.contains("sampled spec"), "{err}");
    let (a, d) = acc(&err);
    assert!(d > 0 && d >= a, "sampled: {a}/{d}");
    assert_eq!(shown_ids(&sampled_gen()), shown_ids(&err), "sampled: the seed does not reproduce");

    // The served engine takes the same flags (the C++ engine's serve line): greedy requests
    // stream the plain greedy ids, with drafts accepted (echo head; suffix drafter), and a
    // sampled request speculates too.
    let greedy = serde_json::json!({"temperature": 0.0});
    let sampled = serde_json::json!({"temperature": 0.9, "top_k": 40, "seed": 7});
    let (served, done) = serve(&model, &[], &greedy);
    assert_eq!(served, plain, "--serve without --spec: ids differ from generate");
    assert!(done["stats"]["draft_offered"].is_null(), "{done}");
    for extra in [vec!["--spec", "4", "--mtp", &echo], vec!["--spec", "4"]] {
        let (ids, done) = serve(&model, &extra, &greedy);
        assert_eq!(ids, plain, "--serve {extra:?}: ids differ from plain greedy");
        let (a, d) = (done["stats"]["draft_accepted"].as_u64(), done["stats"]["draft_offered"].as_u64());
        assert!(a.unwrap_or(0) > 0 && d >= a, "--serve {extra:?}: drafts {a:?}/{d:?} in {done}");
    }
    // The C++ engine's documented serve line for the 7900 XTX, its paths replaced (`--pack`
    // left out, as its error advises): it starts, speculates, and equals the same line without
    // the three speculation flags.
    let line = [
        "--native",
        &model,
        "--ple-gguf",
        files[1],
        "--mmap-experts",
        "--expert-cache",
        "auto",
        "--prefill",
        "512",
        "--max-context",
        "4096",
        "--kv",
        "int8",
        "--pool-workers",
        "15",
        "--adapt-every",
        "0",
        "--pcie-frac",
        "0",
        "--vram-reserve-mib",
        "1024",
    ];
    let (want, _) = serve_with(&line, &greedy);
    let (got, done) =
        serve_with(&[&line[..], &["--spec", "4", "--spec-min-p", "0.5", "--mtp", &echo]].concat(), &greedy);
    assert_eq!(got, want, "the C++ engine's serve line: speculative ids differ from plain greedy");
    assert!(done["stats"]["draft_accepted"].as_u64().unwrap_or(0) > 0, "the serve line accepted no drafts: {done}");

    // A sampled request speculates too (speculative sampling: distributed as plain sampling,
    // the seeded tokens differ), reports its drafts and runs to max_tokens; the same seed
    // gives the same tokens.
    let (plain_sampled, _) = serve(&model, &[], &sampled);
    assert_eq!(plain_sampled.len(), 24);
    for extra in [vec!["--spec", "4", "--mtp", &echo], vec!["--spec", "4"]] {
        let (got, done) = serve(&model, &extra, &sampled);
        assert_eq!(got.len(), 24, "--serve {extra:?}: a sampled request did not run to max_tokens: {done}");
        assert_eq!(done["reason"], "length", "{done}");
        let (a, d) = (done["stats"]["draft_accepted"].as_u64(), done["stats"]["draft_offered"].as_u64());
        assert!(d.unwrap_or(0) > 0 && d >= a, "--serve {extra:?}: a sampled request drafted nothing: {done}");
        assert_eq!(serve(&model, &extra, &sampled).0, got, "--serve {extra:?}: the seed does not reproduce");
    }

    // bench: text and JSON.
    let (out, _) = run_ok(&[
        "bench", "-m", &model, "--pp", "16", "--tg", "16", "--reps", "1", "--spec", "4", "--mtp", &echo, "-t", "2",
    ]);
    assert!(
        out.contains("MTP drafter") && out.contains("acceptance rate") && out.contains("tokens per verify step"),
        "{out}"
    );
    let (out, _) = run_ok(&[
        "bench", "-m", &model, "--pp", "16", "--tg", "16", "--reps", "1", "--spec", "4", "--mtp", &echo, "-t", "2",
        "--json",
    ]);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["spec"]["drafter"], "MTP", "{out}");
    assert!(j["spec"]["acceptance_rate"].as_f64().unwrap() > 0.0, "{out}");
    assert!(j["spec"]["tokens_per_verify"].as_f64().unwrap() > 1.0, "{out}");

    // Errors.
    let base = ["generate", "-m", &model, "--tokens", PROMPT, "-n", "4", "--temp", "0"];
    let with = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend_from_slice(extra);
        run_err(&a)
    };
    let e = with(&["--mtp", &echo]);
    assert!(e.contains("--spec"), "{e}");
    let missing = tmp("nope-mtp.gguf");
    let e = with(&["--spec", "2", "--mtp", missing.to_str().unwrap()]);
    assert!(e.contains("nope-mtp.gguf") && e.contains("not found"), "{e}");
    let bytes = std::fs::read(&echo).unwrap();
    let cut = tmp("cut-mtp.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let e = with(&["--spec", "2", "--mtp", cut.to_str().unwrap()]);
    assert!(e.contains("cut-mtp.gguf") && e.contains("outside the file"), "{e}");
    // A head for another shape (public preset) does not fit the tiny model.
    let other = tmp("public");
    run_ok(&["synth", "--out", other.to_str().unwrap(), "--preset", "public", "--mtp-head", "random"]);
    let e = with(&["--spec", "2", "--mtp", &format!("{}-mtp.gguf", other.display())]);
    assert!(e.contains("public-mtp.gguf") && e.contains("qwen4exp.embedding_length"), "{e}");
    // The head passed as the model.
    let e = run_err(&["generate", "-m", &echo, "--tokens", PROMPT, "-n", "4", "--temp", "0"]);
    assert!(e.contains("MTP") && e.contains("--mtp"), "{e}");
}
