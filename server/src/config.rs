//! Server configuration: one struct that is both the `strata server` flags (clap) and the
//! `strata.json` schema (serde). Doc comments are the `--help` text and the file documentation.
//!
//! Precedence: command-line flag > config file > built-in default. Every field is optional in
//! both places so that "was it given?" can be told apart from "is it the default?".

use crate::engine_process::ProcessEnv;
use crate::serve::{ConnLimits, DEFAULT_BODY_TIMEOUT, DEFAULT_HEADER_TIMEOUT, DEFAULT_MAX_CONNECTIONS_PER_CLIENT};
use anyhow::{Context, bail};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The engine process the server starts: `<executable> <args...> --serve`.
#[derive(Clone, Debug, Default, PartialEq, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineCommand {
    /// Engine executable (default: the running executable, i.e. `strata` itself). A relative
    /// path with a `/` is resolved against the config file's directory; a bare name is looked up
    /// in PATH.
    #[arg(long = "engine", value_name = "PATH")]
    pub executable: Option<PathBuf>,
    /// Engine arguments, before the `--serve` the server appends (e.g. `-m model.gguf
    /// --device cpu`). Repeat the flag once per argument: `--engine-arg=-m --engine-arg=x.gguf`.
    #[arg(long = "engine-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub args: Option<Vec<String>>,
}

/// Options of the OpenAI-compatible HTTP server (`strata server`).
#[derive(Clone, Debug, Default, PartialEq, clap::Args, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// JSON config file (`strata.json`) with the fields below; flags override its values.
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub engine: EngineCommand,
    /// GGUF file whose tokenizer the server uses (normally the model the engine runs; only its
    /// metadata is read). Default: the first `*.gguf` among the engine arguments, else the
    /// engine's default model (`$STRATA_MODEL`, or Qwen2.5-Coder-0.5B-Instruct in the model cache).
    #[arg(long, value_name = "GGUF")]
    pub tokenizer: Option<PathBuf>,
    /// Model name reported by `/v1/models` and in responses (default: the engine's model name).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Address to listen on (default 127.0.0.1).
    #[arg(long)]
    pub host: Option<String>,
    /// TCP port (default 8080; 0 picks a free port, printed at startup).
    #[arg(long)]
    pub port: Option<u16>,
    /// Seconds to wait for a starting engine's hello line (model loading) before giving up on
    /// that start (default 600; at least 1: with 0 no start could succeed).
    #[arg(long, value_name = "SECS")]
    pub startup_timeout: Option<u64>,
    /// Seconds a running engine may stay silent (no output line) while it has requests in
    /// flight before it is considered hung: it is killed and restarted, and its requests fail
    /// with 504 (`engine_timeout`). Default 300; 0 = never. It must exceed the longest prompt
    /// processing, which sends nothing until the first token.
    #[arg(long, value_name = "SECS")]
    pub engine_timeout: Option<u64>,
    /// Seconds a client may leave response data unread (the connection's send buffer full, no
    /// byte accepted) before the server closes the connection, which cancels its request at the
    /// engine. Default 30; 0 = never.
    #[arg(long, value_name = "SECS")]
    pub send_timeout: Option<u64>,
    /// Seconds a client has to send a request's headers, counted from the connection (or the
    /// previous answer on a keep-alive connection); then the connection is closed without an
    /// answer (a client sending a byte now and then, slowloris). Default 10; 0 = never.
    #[arg(long, value_name = "SECS")]
    pub header_timeout: Option<u64>,
    /// Seconds a client has to send a request's body, counted from its headers; then it gets a
    /// 408 and the connection is closed. Default 60; 0 = never.
    #[arg(long, value_name = "SECS")]
    pub body_timeout: Option<u64>,
    /// Connections one client IP address may have open at once; more are answered 429 and
    /// closed. Default 64; 0 = no limit.
    #[arg(long, value_name = "N")]
    pub max_connections_per_client: Option<u64>,
    /// API key clients must send (`Authorization: Bearer KEY` or `x-api-key: KEY`) on every
    /// `/v1` request; `/health` stays open. Also `--api-key-file`, or `$STRATA_API_KEY`.
    /// Default: none (no check). Precedence: `--api-key` > `--api-key-file` > `$STRATA_API_KEY`
    /// > the config's `api_key` > its `api_key_file`. An empty key is an error.
    #[arg(long, value_name = "KEY", conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// File whose first line (trimmed) is the API key (a relative path in the config file is
    /// resolved against the config file's directory).
    #[arg(long, value_name = "FILE")]
    pub api_key_file: Option<PathBuf>,
    /// The C++ engine's config keys (file only), mapped onto ours by [`ServerConfig::from_file`]:
    /// `exe` = `engine.executable`, `args` = `engine.args` (giving both forms is an error).
    #[arg(skip)]
    pub exe: Option<PathBuf>,
    #[arg(skip)]
    pub args: Option<Vec<String>>,
    /// Working directory of the engine process (relative: to the config file's directory).
    #[arg(skip)]
    pub cwd: Option<PathBuf>,
    /// Extra environment variables of the engine process (`{"NAME": "value"}`).
    #[arg(skip)]
    pub env: Option<BTreeMap<String, String>>,
    /// Directories put in front of the engine's `LD_LIBRARY_PATH` (relative: to the config
    /// file's directory).
    #[arg(skip)]
    pub lib_dirs: Option<Vec<PathBuf>>,
}

/// The environment variable that sets the API key (below `--api-key` and `--api-key-file`).
pub const API_KEY_ENV: &str = "STRATA_API_KEY";

/// An API key clients must present. Never printed (`Debug` shows `ApiKey(..)`).
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(std::sync::Arc<str>);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

impl ApiKey {
    /// A key from its text, trimmed; `from` names the source in errors. Empty (or blank) and
    /// control characters (which no HTTP header can carry) are errors.
    pub fn new(text: &str, from: &str) -> anyhow::Result<ApiKey> {
        let key = text.trim();
        if key.is_empty() {
            bail!("the API key from {from} is empty (leave it unset for no key)");
        }
        if key.chars().any(char::is_control) {
            bail!("the API key from {from} contains a control character");
        }
        Ok(ApiKey(key.into()))
    }

    /// The first line of a file, trimmed.
    pub fn from_file(path: &Path) -> anyhow::Result<ApiKey> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading API key file {}", path.display()))?;
        ApiKey::new(text.lines().next().unwrap_or(""), &format!("file {} (first line)", path.display()))
    }

    /// Whether `given` is this key, in time that depends only on `given`'s length (every byte
    /// is compared; no early exit on the first difference).
    pub fn matches(&self, given: &[u8]) -> bool {
        let key = self.0.as_bytes();
        let mut diff = (key.len() != given.len()) as u8;
        for (i, &b) in given.iter().enumerate() {
            // `key` is never empty (`new` refuses it).
            diff |= b ^ key[i % key.len()];
        }
        std::hint::black_box(diff) == 0
    }
}

/// Default `engine_timeout` (seconds).
pub const DEFAULT_ENGINE_TIMEOUT: u64 = 300;
/// Default `send_timeout` (seconds).
pub const DEFAULT_SEND_TIMEOUT: u64 = 30;

fn secs(s: u64) -> Option<Duration> {
    (s > 0).then(|| Duration::from_secs(s))
}

/// The longest timeout taken (a year): longer ones would overflow the clocks' arithmetic, and
/// 0 turns a timeout off instead.
pub const MAX_TIMEOUT_SECS: u64 = 365 * 24 * 3600;

/// A timeout setting checked against [`MAX_TIMEOUT_SECS`]; `name` is its config key.
fn timeout_secs(name: &str, s: u64) -> anyhow::Result<Option<Duration>> {
    if s > MAX_TIMEOUT_SECS {
        bail!(
            "{name} (--{}) of {s} s is too long: at most {MAX_TIMEOUT_SECS} s (a year); \
             0 turns it off",
            name.replace('_', "-")
        );
    }
    Ok(secs(s))
}

/// [`ServerConfig`] with the file merged in, defaults applied and paths resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub executable: PathBuf,
    pub args: Vec<String>,
    pub tokenizer: PathBuf,
    pub model_name: Option<String>,
    pub host: String,
    pub port: u16,
    pub startup_timeout: Duration,
    pub engine_timeout: Option<Duration>,
    /// The engine's working directory and environment (config file only).
    pub process: ProcessEnv,
}

impl ServerConfig {
    /// Read a config file (no merging).
    pub fn from_file(path: &Path) -> anyhow::Result<ServerConfig> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?;
        // With the path of a value of the wrong type (`env.A: invalid type ...`).
        let mut cfg: ServerConfig = serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(&text))
            .map_err(|e| {
                let path_s = e.path().to_string();
                let inner = e.into_inner();
                if path_s == "." { anyhow::anyhow!("{inner}") } else { anyhow::anyhow!("`{path_s}`: {inner}") }
            })
            .with_context(|| format!("parsing config {}", path.display()))?;
        // The C++ engine's names for the engine command.
        if let Some(exe) = cfg.exe.take() {
            if cfg.engine.executable.is_some() {
                bail!("config {}: both `exe` and `engine.executable` are given; use one", path.display());
            }
            cfg.engine.executable = Some(exe);
        }
        if let Some(args) = cfg.args.take() {
            if cfg.engine.args.is_some() {
                bail!("config {}: both `args` and `engine.args` are given; use one", path.display());
            }
            cfg.engine.args = Some(args);
        }
        // Relative paths in a file mean "next to the file", whatever the working directory.
        let dir = path.parent().unwrap_or(Path::new("."));
        if let Some(c) = &cfg.cwd
            && c.is_relative()
        {
            cfg.cwd = Some(dir.join(c));
        }
        if let Some(dirs) = &mut cfg.lib_dirs {
            for d in dirs.iter_mut().filter(|d| d.is_relative()) {
                *d = dir.join(&*d);
            }
        }
        if let Some(exe) = &cfg.engine.executable
            && exe.is_relative()
            && exe.components().count() > 1
        {
            cfg.engine.executable = Some(dir.join(exe));
        }
        if let Some(t) = &cfg.tokenizer
            && t.is_relative()
        {
            cfg.tokenizer = Some(dir.join(t));
        }
        if let Some(t) = &cfg.api_key_file
            && t.is_relative()
        {
            cfg.api_key_file = Some(dir.join(t));
        }
        Ok(cfg)
    }

    /// Flags (self) over the file named by `--config` over defaults.
    pub fn resolve(&self) -> anyhow::Result<Resolved> {
        let file = match &self.config {
            Some(p) => ServerConfig::from_file(p)?,
            None => ServerConfig::default(),
        };
        let executable = match self.engine.executable.clone().or(file.engine.executable) {
            Some(p) => p,
            None => std::env::current_exe().context("finding the running executable (set engine.executable)")?,
        };
        // A relative program path is unspecified once the child's working directory differs.
        let executable = if file.cwd.is_some() && executable.is_relative() && executable.components().count() > 1 {
            std::path::absolute(&executable).unwrap_or(executable)
        } else {
            executable
        };
        // The C++ engine's users put its whole serve line, `--serve` included, into `args`:
        // the server appends `--serve` itself, so one given here is dropped.
        let args: Vec<String> = self
            .engine
            .args
            .clone()
            .or(file.engine.args)
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a != "--serve")
            .collect();
        let tokenizer = match self.tokenizer.clone().or(file.tokenizer) {
            Some(t) => t,
            None => match args.iter().find(|a| a.ends_with(".gguf")).map(PathBuf::from).or_else(default_model) {
                Some(p) => p,
                None => bail!("no tokenizer: set \"tokenizer\" (a GGUF file) in the config or pass --tokenizer"),
            },
        };
        Ok(Resolved {
            executable,
            args,
            tokenizer,
            model_name: self.model_name.clone().or(file.model_name),
            host: self.host.clone().or(file.host).unwrap_or_else(|| "127.0.0.1".into()),
            port: self.port.or(file.port).unwrap_or(8080),
            startup_timeout: startup_timeout(self.startup_timeout.or(file.startup_timeout).unwrap_or(600))?,
            engine_timeout: timeout_secs(
                "engine_timeout",
                self.engine_timeout.or(file.engine_timeout).unwrap_or(DEFAULT_ENGINE_TIMEOUT),
            )?,
            process: ProcessEnv {
                cwd: file.cwd,
                env: file.env.unwrap_or_default().into_iter().collect(),
                lib_dirs: file.lib_dirs.unwrap_or_default(),
            },
        })
    }

    /// The `send_timeout` in effect (flag > file > default; `None` = never). Not part of
    /// [`Resolved`], whose literal other crates build.
    pub fn send_timeout(&self) -> anyhow::Result<Option<Duration>> {
        let file = match (&self.send_timeout, &self.config) {
            (None, Some(p)) => ServerConfig::from_file(p)?.send_timeout,
            _ => None,
        };
        timeout_secs("send_timeout", self.send_timeout.or(file).unwrap_or(DEFAULT_SEND_TIMEOUT))
    }

    /// The limits of a client connection in effect (flag > file > default). Not part of
    /// [`Resolved`], whose literal other crates build.
    pub fn conn_limits(&self) -> anyhow::Result<ConnLimits> {
        let file = match &self.config {
            Some(p) => ServerConfig::from_file(p)?,
            None => ServerConfig::default(),
        };
        let cap = self
            .max_connections_per_client
            .or(file.max_connections_per_client)
            .unwrap_or(DEFAULT_MAX_CONNECTIONS_PER_CLIENT as u64);
        Ok(ConnLimits {
            send_timeout: self.send_timeout()?,
            header_timeout: timeout_secs(
                "header_timeout",
                self.header_timeout.or(file.header_timeout).unwrap_or(DEFAULT_HEADER_TIMEOUT),
            )?,
            body_timeout: timeout_secs(
                "body_timeout",
                self.body_timeout.or(file.body_timeout).unwrap_or(DEFAULT_BODY_TIMEOUT),
            )?,
            max_connections_per_client: (cap > 0).then(|| cap.min(usize::MAX as u64) as usize),
        })
    }
}

/// The engine start timeout: 1 s to [`MAX_TIMEOUT_SECS`]. 0 cannot mean "never" here: the
/// server waits for a start within it, and with 0 every start fails at once and is retried.
fn startup_timeout(s: u64) -> anyhow::Result<Duration> {
    if s == 0 {
        bail!(
            "startup_timeout (--startup-timeout) must be at least 1 second: it is how long an \
             engine may take to load its model, and with 0 no start could succeed"
        );
    }
    if s > MAX_TIMEOUT_SECS {
        bail!(
            "startup_timeout (--startup-timeout) of {s} s is too long: at most \
             {MAX_TIMEOUT_SECS} s (a year)"
        );
    }
    Ok(Duration::from_secs(s))
}

impl ServerConfig {
    /// The API key in effect (`None`: no check): `--api-key` > `--api-key-file` >
    /// `$STRATA_API_KEY` > the config's `api_key` > its `api_key_file`. Not part of
    /// [`Resolved`], whose literal other crates build.
    pub fn api_key(&self) -> anyhow::Result<Option<ApiKey>> {
        self.api_key_with_env(std::env::var(API_KEY_ENV).ok())
    }

    /// [`ServerConfig::api_key`] with `$STRATA_API_KEY` given (`None`: unset).
    pub fn api_key_with_env(&self, env: Option<String>) -> anyhow::Result<Option<ApiKey>> {
        if let Some(k) = &self.api_key {
            return ApiKey::new(k, "--api-key").map(Some);
        }
        if let Some(p) = &self.api_key_file {
            return ApiKey::from_file(p).map(Some);
        }
        if let Some(k) = env {
            return ApiKey::new(&k, API_KEY_ENV).map(Some);
        }
        let file = match &self.config {
            Some(p) => ServerConfig::from_file(p)?,
            None => return Ok(None),
        };
        if let Some(k) = &file.api_key {
            return ApiKey::new(k, "the config's api_key").map(Some);
        }
        match &file.api_key_file {
            Some(p) => ApiKey::from_file(p).map(Some),
            None => Ok(None),
        }
    }
}

/// The warning `strata server` prints when it listens on `host` without an API key and `host`
/// is not a loopback address (`None`: nothing to warn about).
pub fn exposure_warning(host: &str, has_key: bool) -> Option<String> {
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    (!has_key && !loopback).then(|| {
        format!(
            "strata server: warning: listening on {host} (not a loopback address) without an API \
             key: anyone who can reach it can use the server. Set a key with --api-key KEY, \
             --api-key-file FILE, ${API_KEY_ENV} or \"api_key\" in the --config file"
        )
    })
}

/// File name of the engine's default model in its cache (the engine's `fetch::DEFAULT_MODEL`;
/// a test there keeps the two equal).
pub const DEFAULT_MODEL_FILE: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";

/// The model the engine loads when given no `-m`: `$STRATA_MODEL`, else the default model's
/// file in `$STRATA_MODEL_DIR` (or `~/.cache/strata/models`), if it exists.
fn default_model() -> Option<PathBuf> {
    if let Some(m) = std::env::var_os("STRATA_MODEL") {
        return Some(PathBuf::from(m));
    }
    let dir = match std::env::var_os("STRATA_MODEL_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/strata/models"),
    };
    Some(dir.join(DEFAULT_MODEL_FILE)).filter(|p| p.exists())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        server: ServerConfig,
    }

    #[test]
    fn flags_parse_including_hyphenated_engine_args() {
        let cli = Cli::try_parse_from([
            "strata",
            "--engine",
            "/bin/strata",
            "--engine-arg",
            "-m",
            "--engine-arg=m.gguf",
            "--port",
            "9001",
        ])
        .unwrap();
        let r = cli.server.resolve().unwrap();
        assert_eq!(r.executable, PathBuf::from("/bin/strata"));
        assert_eq!(r.args, vec!["-m", "m.gguf"]);
        assert_eq!(r.tokenizer, PathBuf::from("m.gguf"), "defaults to the engine's model");
        assert_eq!((r.host.as_str(), r.port), ("127.0.0.1", 9001));
        assert_eq!(r.startup_timeout, Duration::from_secs(600));
        assert_eq!(r.engine_timeout, Some(Duration::from_secs(300)));
        assert_eq!(cli.server.send_timeout().unwrap(), Some(Duration::from_secs(30)));
    }

    /// The C++ engine's users keep its serve line, `--serve` included, in the config's
    /// `engine.args`: accepted, with the `--serve` dropped (the server appends its own).
    #[test]
    fn a_serve_line_in_the_config_args_is_accepted() {
        let dir = std::env::temp_dir().join(format!("strata-config-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("strata.json");
        let json = r#"{"engine": {"args": ["--serve", "--native", "m.gguf", "--kv", "int8", "--serve"]}}"#;
        std::fs::write(&path, json).unwrap();
        let cli = Cli::try_parse_from(["strata", "--config", path.to_str().unwrap()]).unwrap();
        let r = cli.server.resolve().unwrap();
        assert_eq!(r.args, vec!["--native", "m.gguf", "--kv", "int8"]);
        assert_eq!(r.tokenizer, PathBuf::from("m.gguf"));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn zero_turns_the_timeouts_off() {
        let cli =
            Cli::try_parse_from(["strata", "--tokenizer", "t.gguf", "--engine-timeout", "0", "--send-timeout", "0"])
                .unwrap();
        assert_eq!(cli.server.resolve().unwrap().engine_timeout, None);
        assert_eq!(cli.server.send_timeout().unwrap(), None);
        let cli = Cli::try_parse_from(["strata", "--tokenizer", "t.gguf", "--engine-timeout", "7"]).unwrap();
        assert_eq!(cli.server.resolve().unwrap().engine_timeout, Some(Duration::from_secs(7)));
    }

    #[test]
    fn api_key_flags() {
        let cli = Cli::try_parse_from(["strata", "--api-key", "k1"]).unwrap();
        assert!(cli.server.api_key_with_env(None).unwrap().unwrap().matches(b"k1"));
        let cli = Cli::try_parse_from(["strata", "--api-key-file", "/nonexistent/k"]).unwrap();
        assert_eq!(cli.server.api_key_file, Some(PathBuf::from("/nonexistent/k")));
        assert!(cli.server.api_key_with_env(None).is_err(), "a missing file is an error");
        assert!(Cli::try_parse_from(["strata", "--api-key", "a", "--api-key-file", "f"]).is_err(), "not both");
        let none = Cli::try_parse_from(["strata"]).unwrap();
        assert_eq!(none.server.api_key_with_env(None).unwrap(), None);
    }

    #[test]
    fn a_missing_tokenizer_is_an_error() {
        if default_model().is_none() {
            assert!(ServerConfig::default().resolve().unwrap_err().to_string().contains("tokenizer"));
        }
    }
}
