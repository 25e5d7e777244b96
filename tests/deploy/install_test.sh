#!/usr/bin/env bash
# Installs the build into a staging prefix and runs what was installed:
# the daemon from its example flag file, spikectl against it, and the
# systemd unit through `systemd-analyze verify`. Usage: install_test.sh BUILD_DIR
set -euo pipefail
BUILD=$1
TMP=$(mktemp -d)
DAEMON_PID=
cleanup() {
  if [ -n "$DAEMON_PID" ] && kill -0 "$DAEMON_PID" 2>/dev/null; then kill "$DAEMON_PID"; wait "$DAEMON_PID" || true; fi
  rm -rf "$TMP"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

STAGE=$TMP/stage
cmake --install "$BUILD" --prefix "$STAGE" > "$TMP/install.log" || { cat "$TMP/install.log"; fail "cmake --install"; }
for f in bin/spikeguardd bin/spikectl bin/spikeguard-worker bin/spikeguard-tracegen bin/spikeguard-detect \
         lib/systemd/system/spikeguardd.service share/spikeguard/examples/spikeguardd.flags.example \
         share/spikeguard/examples/launch-profiles.textproto.example; do
  [ -e "$STAGE/$f" ] || fail "not installed: $f"
done
for b in spikeguardd spikectl spikeguard-worker; do
  [ -x "$STAGE/bin/$b" ] || fail "not executable: bin/$b"
  # Installed binaries need nothing from the build tree.
  if ldd "$STAGE/bin/$b" | grep -q "$BUILD"; then fail "bin/$b links from the build tree"; fi
done

# The daemon as the unit starts it: the example flag file, then the data dir
# (here a temp dir, and port 0 instead of 7070).
PORT_FILE=$TMP/port
"$STAGE/bin/spikeguardd" --flagfile="$STAGE/share/spikeguard/examples/spikeguardd.flags.example" \
  --data-dir="$TMP/data" --listen=127.0.0.1:0 --port-file="$PORT_FILE" 2> "$TMP/daemon.err" &
DAEMON_PID=$!
for _ in $(seq 1 250); do
  [ -s "$PORT_FILE" ] && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$TMP/daemon.err"; fail "installed daemon exited"; }
  sleep 0.1
done
[ -s "$PORT_FILE" ] || { cat "$TMP/daemon.err"; fail "installed daemon did not start"; }
ADDR=127.0.0.1:$(cat "$PORT_FILE")
# Secure by default: no --tokens in the example, so it made an admin token.
[ -s "$TMP/data/admin.token" ] || fail "no generated admin token in the data dir"
[ "$(stat -c %a "$TMP/data/admin.token")" = 600 ] || fail "admin.token is not 0600"
if "$STAGE/bin/spikectl" --addr="$ADDR" runs list > "$TMP/anon.out" 2>&1; then
  fail "an anonymous spikectl was served"
fi
grep -q UNAUTHENTICATED "$TMP/anon.out" || { cat "$TMP/anon.out"; fail "anonymous call not UNAUTHENTICATED"; }
"$STAGE/bin/spikectl" --addr="$ADDR" --token-file="$TMP/data/admin.token" runs create staged --world-size=1 > /dev/null
"$STAGE/bin/spikectl" --addr="$ADDR" --token-file="$TMP/data/admin.token" runs list > "$TMP/list.out"
grep -q "^staged " "$TMP/list.out" || { cat "$TMP/list.out"; fail "the run created through the installed spikectl is not listed"; }
kill -TERM "$DAEMON_PID"
wait "$DAEMON_PID" || fail "installed daemon did not stop cleanly on SIGTERM"
DAEMON_PID=

# The unit: systemd's own checker, on a copy whose ExecStart points into the
# staging prefix (the installed one names the final prefix).
UNIT=$STAGE/lib/systemd/system/spikeguardd.service
grep -q '^ExecStart=/.*/spikeguardd --flagfile=' "$UNIT" || fail "unit has no ExecStart of spikeguardd"
for k in User=spikeguard StateDirectory=spikeguard ProtectSystem=strict NoNewPrivileges=yes Restart=on-failure; do
  grep -qx "$k" "$UNIT" || fail "unit lacks $k"
done
if command -v systemd-analyze > /dev/null; then
  mkdir -p "$TMP/unit"
  sed "s|^ExecStart=[^ ]*/spikeguardd|ExecStart=$STAGE/bin/spikeguardd|" "$UNIT" > "$TMP/unit/spikeguardd.service"
  if ! systemd-analyze verify "$TMP/unit/spikeguardd.service" > "$TMP/verify.out" 2>&1; then
    cat "$TMP/verify.out"; fail "systemd-analyze verify"
  fi
  # Warnings print but do not fail verify; none is expected of this unit.
  if grep -v "^$" "$TMP/verify.out" | grep -qv "network-online.target\|multi-user.target"; then
    cat "$TMP/verify.out"; fail "systemd-analyze verify warned"
  fi
else
  echo "systemd-analyze not found: unit syntax not checked"
fi
echo "PASS: installed into $STAGE, daemon served, unit verified"
