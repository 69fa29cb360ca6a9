#!/usr/bin/env bash
# What the container images carry, checked without a container engine: docker/collect-runtime.sh
# run on a build tree gathers every binary the Dockerfiles build, and those binaries resolve every
# shared library inside the collected lib/ directory (or the C runtime a base image provides) and
# start from there.
#   runtime_closure.sh SRC_DIR BUILD_DIR
set -euo pipefail
SRC=$1 BUILD=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$SRC/docker/collect-runtime.sh" "$BUILD" "$T/rt" >/dev/null

# Each Dockerfile builds exactly the binaries collect-runtime.sh gathers (plus the CUDA module).
collected=$(cd "$T/rt/bin" && ls | grep -v '\.so$' | sort | tr '\n' ' ')
for f in Dockerfile Dockerfile.cuda; do
  built=$(sed -n '/deploy\/build.sh image/,/collect-runtime/p' "$SRC/docker/$f" |
    tr ' \\&' '\n' | grep -E '^riskkv-|^riskkvctl$' | sort -u | tr '\n' ' ')
  [ "$built" = "$collected" ] || fail "$f builds '$built' but the image collects '$collected'"
done
grep -q 'riskkv_cuda' "$SRC/docker/Dockerfile.cuda" || fail "Dockerfile.cuda does not build the CUDA module"

# Every library resolves inside lib/ or is part of the C runtime every base image has.
base='/(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|linux-vdso'
for obj in "$T"/rt/bin/*; do
  out=$(LD_LIBRARY_PATH="$T/rt/lib" ldd "$obj")
  while read -r line; do
    [[ $line == *"not found"* ]] && fail "$(basename "$obj"): $line"
    path=$(awk '{print ($2 == "=>") ? $3 : $1}' <<<"$line")
    [[ $path == "$T/rt/lib/"* ]] || [[ $path =~ $base ]] ||
      fail "$(basename "$obj") loads $path from outside the collected libraries"
  done <<<"$out"
done
[ "$(ls "$T/rt/lib" | wc -l)" -gt 10 ] || fail "suspiciously few libraries collected"

# The collected binaries start: riskkvctl reaches its gRPC client and reports the refused port.
out=$(LD_LIBRARY_PATH="$T/rt/lib" "$T/rt/bin/riskkvctl" --node 127.0.0.1:1 health 2>&1) &&
  fail "health of a closed port succeeded: $out"
grep -q "127.0.0.1:1" <<<"$out" || fail "riskkvctl from the collected tree: $out"
echo "runtime closure: $(ls "$T/rt/bin" | wc -l) files, $(ls "$T/rt/lib" | wc -l) libraries"
