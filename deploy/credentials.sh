#!/usr/bin/env bash
# Generates the credentials of a riskkv deployment into DIR (never into the repository's
# tracked files): an access file naming three identities, and each one's bearer token.
#   DIR/access          for every riskkv-node and riskkv-control (--access-file)
#   DIR/node.token      identity "edge", role node: what nodes present to each other and to the
#                       control plane (--peer-token-file)
#   DIR/operator.token  identity "ops", role operator: puts policies, sees every session
#   DIR/client.token    identity "demo", role client: its own sessions only
# An existing DIR/access is kept (rotate by deleting the directory and running this again, then
# restarting nothing: servers and clients read changed files within a second).
#   deploy/credentials.sh DIR [--owner UID]   # --owner: chown the files (a container's user)
set -euo pipefail
dir=${1:?usage: deploy/credentials.sh DIR [--owner UID]}
owner=""
if [ "${2:-}" = --owner ]; then owner=${3:?--owner needs a uid}; fi
umask 077
mkdir -p "$dir"
chmod 700 "$dir"
if [ -s "$dir/access" ]; then
  echo "[credentials] $dir/access exists; kept"
else
  token() { od -An -N16 -tx1 /dev/urandom | tr -d ' \n'; }
  for who in node operator client; do token >"$dir/$who.token"; echo >>"$dir/$who.token"; done
  cat >"$dir/access" <<ACCESS
# riskkv access file (services/access/access_list.h): ROLE IDENTITY token SECRET
node     edge  token $(head -1 "$dir/node.token")
operator ops   token $(head -1 "$dir/operator.token")
client   demo  token $(head -1 "$dir/client.token")
ACCESS
  echo "[credentials] wrote $dir/access and the tokens of edge (node), ops (operator), demo (client)"
fi
# Containers run as another user: the files are theirs, readable by nobody else; the directory
# keeps other users of this machine out.
chmod 600 "$dir"/access "$dir"/*.token
if [ -n "$owner" ]; then chown "$owner:$owner" "$dir"/access "$dir"/*.token; fi
