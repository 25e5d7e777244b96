#!/usr/bin/env bash
# deploy/stage.sh NAME COMMAND...: runs COMMAND; when STAGE_TIMES names a
# file, appends "NAME SECONDS EXIT" to it (.ci/run prints them at its end).
set -u
name=$1
shift
start=$(date +%s)
"$@"
rc=$?
if [ -n "${STAGE_TIMES:-}" ]; then
  printf '%-16s %5ds  exit %d\n' "$name" "$(( $(date +%s) - start ))" "$rc" >> "$STAGE_TIMES"
fi
exit $rc
