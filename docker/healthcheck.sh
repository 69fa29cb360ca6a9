#!/bin/sh
# The images' HEALTHCHECK: finds the riskkv server running in the container (riskkv-node or
# riskkv-control), reads the gRPC address it listens on (--listen, or its default) and its TLS
# files from its command line, and asks its gRPC health service through riskkvctl. Healthy (0)
# when it answers SERVING; unhealthy (1) when it does not, or when no riskkv server runs (a
# container running riskkvctl or riskkv-calibrate has nothing to probe).
set -u
for cmdline in /proc/[0-9]*/cmdline; do
  [ -r "$cmdline" ] || continue
  # One argument per line; a server's own arguments come after its name.
  args=$(tr '\0' '\n' <"$cmdline" 2>/dev/null) || continue
  name=$(printf '%s\n' "$args" | head -n 1)
  case "${name##*/}" in
    riskkv-node) kind=node listen=127.0.0.1:7070 ;;
    riskkv-control) kind=control listen=127.0.0.1:7000 ;;
    *) continue ;;
  esac
  tls=""
  next=""
  for a in $(printf '%s\n' "$args" | tail -n +2); do
    if [ -n "$next" ]; then
      case "$next" in
        listen) listen=$a ;;
        *) tls="$tls --$next=$a" ;;
      esac
      next=""
      continue
    fi
    case "$a" in
      --listen=* | -listen=*) listen=${a#*=} ;;
      --listen | -listen) next=listen ;;
      --tls-cert=* | --tls_cert=* | --tls-key=* | --tls_key=* | --tls-ca=* | --tls_ca=*)
        tls="$tls $a" ;;
      --tls-cert | --tls_cert) next=tls-cert ;;
      --tls-key | --tls_key) next=tls-key ;;
      --tls-ca | --tls_ca) next=tls-ca ;;
    esac
  done
  # A wildcard address is reached on loopback.
  host=${listen%:*} port=${listen##*:}
  case "$host" in
    "" | 0.0.0.0 | "[::]" | "::") host=127.0.0.1 ;;
  esac
  # shellcheck disable=SC2086 # $tls is a list of flags
  if [ "$kind" = node ]; then
    exec riskkvctl --node "$host:$port" $tls health
  else
    exec riskkvctl --control "$host:$port" $tls control-health
  fi
done
echo "healthcheck: no riskkv-node or riskkv-control runs in this container" >&2
exit 1
