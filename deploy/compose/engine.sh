# A container engine for deploy/compose/smoke.sh; source it (as root).
#
#   engine_up        uses the Docker engine that answers (DOCKER_HOST or the default socket);
#                    otherwise starts one of its own: its data root under $RISKKV_HOME/docker
#                    (kept between runs, so base images and build layers are reused), its own
#                    socket, pid file and bridge (riskkvsmoke0, 10.199.128.1/24; compose networks
#                    from 10.199.132.0/22), so it touches no other engine and no address outside
#                    this machine. Exports DOCKER_HOST. Returns 1 with ENGINE_WHY set when no
#                    engine can be started.
#   engine_down      stops the engine engine_up started (nothing when it found one running).
#   base_images      makes debian:12 and debian:12-slim with debootstrap when they are absent.

ENGINE_HOME="${RISKKV_HOME:-$HOME/.cache/riskkv}/docker"
ENGINE_RUN=/run/riskkv-smoke
ENGINE_BRIDGE=riskkvsmoke0
ENGINE_STARTED=0
ENGINE_WHY=""

_engine_log() { printf '[engine] %s\n' "$*" >&2; }

engine_up() {
  if docker version >/dev/null 2>&1; then
    _engine_log "using the running Docker engine"
    return 0
  fi
  local tool
  for tool in dockerd containerd iptables; do
    command -v $tool >/dev/null || {
      ENGINE_WHY="no $tool (apt-get install docker.io iptables, or deploy/setup.sh as root)"
      return 1
    }
  done
  mkdir -p "$ENGINE_HOME/root" "$ENGINE_RUN"
  export DOCKER_HOST="unix://$ENGINE_RUN/docker.sock"
  # One this script started earlier and left running (an interrupted run): use it, leave it.
  if [ -f "$ENGINE_RUN/dockerd.pid" ] && kill -0 "$(cat "$ENGINE_RUN/dockerd.pid")" 2>/dev/null &&
    docker version >/dev/null 2>&1; then
    _engine_log "using the engine an earlier run left at $DOCKER_HOST"
    return 0
  fi
  ip link show $ENGINE_BRIDGE >/dev/null 2>&1 || {
    ip link add $ENGINE_BRIDGE type bridge &&
      ip addr add 10.199.128.1/24 dev $ENGINE_BRIDGE &&
      ip link set $ENGINE_BRIDGE up
  } || {
    ENGINE_WHY="cannot make the bridge $ENGINE_BRIDGE (ip link add ... type bridge failed)"
    return 1
  }
  _engine_log "starting dockerd (data root $ENGINE_HOME/root, log $ENGINE_HOME/dockerd.log)"
  dockerd --storage-driver=overlay2 --data-root "$ENGINE_HOME/root" \
    --exec-root "$ENGINE_RUN/exec" --pidfile "$ENGINE_RUN/dockerd.pid" -H "$DOCKER_HOST" \
    --bridge $ENGINE_BRIDGE --default-address-pool base=10.199.132.0/22,size=24 \
    >"$ENGINE_HOME/dockerd.log" 2>&1 &
  ENGINE_STARTED=1
  local i
  for i in $(seq 60); do
    docker version >/dev/null 2>&1 && { _engine_log "dockerd is up"; return 0; }
    kill -0 $! 2>/dev/null || break
    sleep 1
  done
  ENGINE_WHY="dockerd did not start: $(tail -n 3 "$ENGINE_HOME/dockerd.log" | tr '\n' ' ')"
  engine_down
  return 1
}

engine_down() {
  [ "$ENGINE_STARTED" = 1 ] || return 0
  local pid i
  pid=$(cat "$ENGINE_RUN/dockerd.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for i in $(seq 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  # dockerd stops the containerd it started; one left behind (a killed dockerd) goes too.
  pkill -f "containerd --config $ENGINE_RUN/exec/" 2>/dev/null || true
  ip link delete $ENGINE_BRIDGE 2>/dev/null || true
  rm -f "$ENGINE_RUN/dockerd.pid"
  ENGINE_STARTED=0
  _engine_log "dockerd stopped"
}

# Makes debian:12 and debian:12-slim (the same tree without docs, man pages and locales) from one
# debootstrap, for those of the two that are missing.
base_images() {
  local need=() dir
  docker image inspect debian:12 >/dev/null 2>&1 || need+=(debian:12)
  docker image inspect debian:12-slim >/dev/null 2>&1 || need+=(debian:12-slim)
  ((${#need[@]})) || return 0
  command -v debootstrap >/dev/null || {
    echo "no ${need[*]} image and no debootstrap to make one (apt-get install debootstrap)" >&2
    return 1
  }
  dir=$(mktemp -d "$ENGINE_HOME/rootfs.XXXXXX")
  _engine_log "making ${need[*]} with debootstrap (about a minute)"
  debootstrap --variant=minbase bookworm "$dir" http://deb.debian.org/debian >"$dir.log" 2>&1 || {
    tail -n 5 "$dir.log" >&2
    rm -rf "$dir" "$dir.log"
    return 1
  }
  rm -f "$dir.log" "$dir/etc/apt/sources.list"
  cat >"$dir/etc/apt/sources.list.d/debian.sources" <<'EOF'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb
  if [[ " ${need[*]} " == *" debian:12 "* ]]; then
    tar -C "$dir" --numeric-owner -c . | docker import -c 'CMD ["bash"]' - debian:12 >/dev/null
  fi
  if [[ " ${need[*]} " == *" debian:12-slim "* ]]; then
    rm -rf "$dir"/usr/share/doc/* "$dir"/usr/share/man/* "$dir"/usr/share/info/*
    find "$dir/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
    tar -C "$dir" --numeric-owner -c . | docker import -c 'CMD ["bash"]' - debian:12-slim >/dev/null
  fi
  rm -rf "$dir"
}
