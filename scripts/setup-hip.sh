# shellcheck shell=bash
# The AMD GPU part of setup.sh (sourced by it; docs/amd-hip.md "Setting up a Radeon"):
#
#   hip_detect BIN        which card: `BIN device --json` (KFD topology + HIP; one implementation
#                         of the sysfs parsing, gpu-executor/src/kfd.rs) → det_backend, det_index, ...
#   hip_find_rocm BIN     a ROCm whose libamdhip64 + hipBLAS open the card through BIN (a
#                         --features gpu build): $ROCM_PATH, /opt/rocm, the ROCm wheels in
#                         $STRATA_VENV, the system path; none → AMD's wheels into $STRATA_VENV
#   hip_selftest BIN      `strata device --selftest` once on the card
#   hip_write_start MODEL BIN PORT   strata-server.json + run-strata.sh (the env found above)
#
# Settings: STRATA_VENV (default ./.venv), STRATA_ROCM_VERSION (default below),
# STRATA_ROCM_INDEX (default AMD's index for the card's family), STRATA_SYSFS_ROOT (tests).

# AMD's release index of ROCm Python wheels ("TheRock"), one per GPU family, and the pinned
# SDK version; both overridable.
hip_rocm_version_default=7.13.0
hip_rocm_index_base=https://repo.amd.com/rocm/whl
hip_venv=${STRATA_VENV:-$PWD/.venv}

hip_die() { echo "setup.sh: $*" >&2; exit 1; }

# Prints `key=value` lines of `strata device --json` (read on stdin) that the shell needs.
hip_json_fields() {
  python3 -c '
import json, sys
d = json.load(sys.stdin)
sel = d.get("selected") or {}
hip = d.get("hip") or {}
dev = (hip.get("devices") or [{}])[0]
out = {
  "backend": d.get("backend"), "reason": d.get("reason"), "selection_error": d.get("selection_error"),
  "index": sel.get("index"), "arch": sel.get("arch"), "name": sel.get("name"), "via": sel.get("via"),
  "rocr": sel.get("rocr_visible_devices"), "hip_built": int(bool(hip.get("built"))),
  "hip_error": hip.get("error"), "hip_count": len(hip.get("devices") or []),
  "hip_name": dev.get("name"), "hip_arch": dev.get("arch"), "hip_runtime": dev.get("runtime"),
  "hip_blas": dev.get("blas"), "hip_lt": dev.get("blas_lt_version"),
  "hip_refused": "; ".join("GPU %s %s (%s): %s" % (r["index"], r["name"], r["arch"], r["why"]) for r in hip.get("refused") or []),
}
for k, v in out.items():
    print("%s=%s" % (k, "" if v is None else str(v).replace("\n", " ")))
'
}

# Reads hip_json_fields output into variables named PREFIX<key>.
hip_read_fields() {
  local prefix=$1 line
  while IFS= read -r line; do printf -v "$prefix${line%%=*}" '%s' "${line#*=}"; done
}

# Lists what the machine has and sets det_* (backend, index, arch, name, rocr, reason).
hip_detect() {
  local bin=$1 json
  echo "==> GPU detection (strata device${STRATA_SYSFS_ROOT:+, sysfs root $STRATA_SYSFS_ROOT})"
  "$bin" device ${gpu:+--gpu "$gpu"} | sed 's/^/    /' || true
  if ! command -v python3 >/dev/null; then
    det_backend=cpu det_reason="python3 not found, so \`strata device --json\` cannot be read" det_index= det_rocr=
    return 0
  fi
  json=$("$bin" device --json ${gpu:+--gpu "$gpu"}) || hip_die "\`$bin device --json\` failed"
  det_backend=cpu det_reason="\`strata device --json\` gave no readable answer" det_selection_error= det_index= det_arch= det_name= det_rocr=
  hip_read_fields det_ < <(printf '%s' "$json" | hip_json_fields)
  [ -z "$det_selection_error" ] || hip_die "$det_selection_error"
}

# Runs BIN device --json with a ROCm environment (and ROCR_VISIBLE_DEVICES=$4 when given):
# sets try_* from it.
hip_try_env() {
  local bin=$1 root=$2 ld=$3 rocr=${4:-}
  local -a env_args=(env -u ROCM_PATH -u ROCR_VISIBLE_DEVICES)
  [ -n "$root" ] && env_args+=(ROCM_PATH="$root")
  [ -n "$ld" ] && env_args+=(LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  [ -n "$rocr" ] && env_args+=(ROCR_VISIBLE_DEVICES="$rocr")
  try_hip_built=1 try_hip_count=0 try_hip_blas= try_hip_lt= try_hip_refused= try_hip_error="\`$bin device --json\` failed with this ROCm"
  hip_read_fields try_ < <("${env_args[@]}" "$bin" device --json | hip_json_fields)
}

# The ROCm wheels in $hip_venv: sets venv_root and venv_ld (empty when not installed).
hip_venv_paths() {
  venv_root=; venv_ld=
  local d sp
  for sp in "$hip_venv"/lib/python3*/site-packages; do
    [ -d "$sp" ] || continue
    for d in "$sp"/_rocm_sdk_core*/lib "$sp"/_rocm_sdk_libraries*/lib; do
      [ -d "$d" ] && venv_ld=${venv_ld:+$venv_ld:}$d
    done
    [ -n "$venv_ld" ] || continue
    # The devel tree is a complete ROCm root; without rocm[devel], the core package.
    venv_root=$("$hip_venv/bin/rocm-sdk" path --root 2>/dev/null) \
      || venv_root=$(compgen -G "$sp/_rocm_sdk_core*" | head -n1)
  done
}

# Does this ROCm open the card? Args: BIN LABEL ROOT LD. Sets rocm_root/rocm_ld on success.
hip_check_rocm() {
  local bin=$1 label=$2 root=$3 ld=$4 libdir
  # Only the chosen card visible (its KFD UUID or index); if the runtime then sees nothing
  # (index numbering differs), fall back to its own index of the card.
  hip_rocr=${det_rocr:-}; hip_device=0
  hip_try_env "$bin" "$root" "$ld" "$hip_rocr"
  if [ "$try_hip_built" = 1 ] && [ "$try_hip_count" = 0 ] && [ -n "$hip_rocr" ]; then
    hip_rocr=; hip_device=${det_index:-0}
    hip_try_env "$bin" "$root" "$ld"
  fi
  if [ "$try_hip_built" != 1 ]; then
    # A CPU build cannot open HIP: only check that the libraries are there.
    local hip_lib= blas_lib=
    for libdir in ${root:+$root/lib} ${ld//:/ }; do
      [ -n "$hip_lib" ] || hip_lib=$(compgen -G "$libdir/libamdhip64.so*" | head -n1) || true
      [ -n "$blas_lib" ] || blas_lib=$(compgen -G "$libdir/libhipblas.so*" | head -n1) || true
    done
    if [ -n "$hip_lib" ] && [ -n "$blas_lib" ]; then
      echo "    $label: libamdhip64 and libhipblas present in $(dirname "$hip_lib") and $(dirname "$blas_lib") (not opened: CPU build)"
      rocm_root=$root; rocm_ld=$ld; return 0
    fi
    echo "    $label: no libamdhip64 + libhipblas found"; return 1
  fi
  if [ "$try_hip_count" -gt 0 ] && [ -z "$try_hip_blas" ]; then
    echo "    $label: $try_hip_runtime opens $try_hip_name, but hipBLAS does not load"; return 1
  fi
  if [ "$try_hip_count" -gt 0 ]; then
    echo "    $label: $try_hip_runtime opens GPU 0: $try_hip_name ($try_hip_arch)"
    echo "      hipBLAS: $try_hip_blas"
    echo "      hipBLASLt: ${try_hip_lt:-not loaded (optional)}"
    rocm_root=$root; rocm_ld=$ld; return 0
  fi
  echo "    $label: ${try_hip_error:-$try_hip_refused}"; return 1
}

# Human-readable byte count.
hip_size() { awk -v b="$1" 'BEGIN { split("B KiB MiB GiB TiB", u); i = 1; while (b >= 1024 && i < 5) { b /= 1024; i++ } printf (i == 1 ? "%d %s" : "%.1f %s"), b, u[i] }'; }

# Installs AMD's ROCm wheels for the selected card's family into $hip_venv, announcing the size.
hip_install_wheels() {
  local family version index spec report counts n bytes unknown
  case "$det_arch" in
    gfx110[0-3]*) family=gfx110X-all ;;
    *) hip_die "no ROCm wheel family known for $det_arch; set STRATA_ROCM_INDEX" ;;
  esac
  version=${STRATA_ROCM_VERSION:-$hip_rocm_version_default}
  index=${STRATA_ROCM_INDEX:-$hip_rocm_index_base/$family/}
  spec="rocm[libraries,devel]==$version"
  if [ ! -x "$hip_venv/bin/python" ]; then
    echo "==> python venv for the ROCm wheels: $hip_venv"
    python3 -m venv "$hip_venv" || hip_die "python3 -m venv $hip_venv failed (Debian/Ubuntu: apt install python3-venv)"
  fi
  # `pip install --report` needs pip 22.2 (Ubuntu 22.04's venv pip is 22.0).
  "$hip_venv/bin/python" -c 'import pip, sys; sys.exit(tuple(map(int, pip.__version__.split(".")[:2])) < (22, 2))' \
    || "$hip_venv/bin/python" -m pip install --quiet --upgrade pip
  report=$(mktemp --suffix=.json)
  echo "==> resolving $spec from $index"
  "$hip_venv/bin/python" -m pip install --quiet --dry-run --ignore-installed --report "$report" --index-url "$index" "$spec" \
    || hip_die "pip could not resolve $spec from $index (set STRATA_ROCM_VERSION / STRATA_ROCM_INDEX)"
  # Sizes: HTTP HEAD Content-Length of every file pip would download.
  counts=$(python3 - "$report" <<'PY'
import json, sys, urllib.request
n = total = unknown = 0
for item in json.load(open(sys.argv[1])).get("install", []):
    url = (item.get("download_info") or {}).get("url")
    if not url:
        continue
    n += 1
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=60) as r:
            total += int(r.headers["Content-Length"])
    except Exception:
        unknown += 1
print(n, total, unknown)
PY
)
  rm -f "$report"
  read -r n bytes unknown <<<"$counts"
  local note=; [ "$unknown" = 0 ] || note="; size unknown for $unknown of them"
  echo "==> ROCm $version wheels: $n files, $(hip_size "$bytes") to download ($bytes bytes$note) into $hip_venv"
  "$hip_venv/bin/python" -m pip install --quiet --index-url "$index" "$spec" || hip_die "pip install $spec failed"
  [ -x "$hip_venv/bin/rocm-sdk" ] && "$hip_venv/bin/rocm-sdk" init --quiet >/dev/null 2>&1 || true
}

# Finds (or installs) a ROCm that opens the selected card; exports nothing, sets rocm_root and
# rocm_ld for hip_write_start.
hip_find_rocm() {
  local bin=$1
  rocm_root=; rocm_ld=
  echo "==> looking for ROCm (libamdhip64, hipBLAS, hipBLASLt)"
  if [ -n "${ROCM_PATH:-}" ] && hip_check_rocm "$bin" "\$ROCM_PATH=$ROCM_PATH" "$ROCM_PATH" ""; then return 0; fi
  if [ "${ROCM_PATH:-}" != /opt/rocm ] && [ -d /opt/rocm ] && hip_check_rocm "$bin" /opt/rocm /opt/rocm ""; then return 0; fi
  hip_venv_paths
  if [ -n "$venv_ld" ] && hip_check_rocm "$bin" "ROCm wheels in $hip_venv" "$venv_root" "$venv_ld"; then return 0; fi
  if hip_check_rocm "$bin" "system library path" "" ""; then return 0; fi
  hip_install_wheels
  hip_venv_paths
  [ -n "$venv_ld" ] || hip_die "the ROCm wheels installed no _rocm_sdk_core*/lib under $hip_venv"
  hip_check_rocm "$bin" "ROCm wheels in $hip_venv" "$venv_root" "$venv_ld" \
    || hip_die "the ROCm wheels in $hip_venv do not open the card (above); see docs/amd-hip.md"
}

# The environment lines of the start script.
hip_env_lines() {
  [ -n "$rocm_root" ] && printf 'export ROCM_PATH=%q\n' "$rocm_root"
  [ -n "$rocm_ld" ] && printf 'export LD_LIBRARY_PATH=%q${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}\n' "$rocm_ld"
  if [ -n "${hip_rocr:-}" ]; then
    printf 'export ROCR_VISIBLE_DEVICES=%q   # only %s\n' "$hip_rocr" "$det_name"
  fi
  printf 'export STRATA_HIP_DEVICE=%q\n' "${hip_device:-0}"
}

hip_selftest() {
  local bin=$1 report=$PWD/strata-selftest.json
  echo "==> strata device --selftest --device hip (kernel parity + microbenchmarks on the card)"
  if ! (eval "$(hip_env_lines)"; "$bin" device --selftest --device hip --report "$report"); then
    hip_die "the GPU self-test failed (report: $report). Please attach it to an issue; --no-selftest skips this step"
  fi
  echo "    report: $report"
}

# strata-server.json and run-strata.sh in the project directory.
hip_write_start() {
  local model=$1 bin=$2 port=$3 cfg=$PWD/strata-server.json script=$PWD/run-strata.sh
  python3 -c 'import json, sys; print(json.dumps({"engine": {"executable": sys.argv[1], "args": ["--device", "hip"]}, "tokenizer": sys.argv[2], "port": int(sys.argv[3])}, indent=2))' \
    "$bin" "$model" "$port" > "$cfg"
  {
    echo '#!/usr/bin/env bash'
    echo "# Written by setup.sh --backend hip: the OpenAI-compatible server on $det_name ($det_arch)."
    hip_env_lines
    printf 'exec %q server --config %q "$@"\n' "$bin" "$cfg"
  } > "$script"
  chmod +x "$script"
  echo "==> wrote $cfg and $script"
}
