#!/usr/bin/env bash
# For a device call only: the working tree that travels to a lent GPU machine is capped at 64 MiB (tracked files,
# untracked files git does not ignore, carried paths), and this repository's tracked files passed that on 2026-11-27.
#   bash experiments/gpu/slim.sh on    # take what no GPU check reads out of git's index: the base and SFT models,
#                                      # the committed plots (they stay on disk, ignored for the call)
#   bash experiments/gpu/slim.sh off   # put them back: run it before any commit
# `on` refuses when changes are staged (a commit while slim would delete those files from the repository).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
EXCLUDE=$(git rev-parse --git-path info/exclude)
BEGIN="# experiments/gpu/slim.sh: begin" END="# experiments/gpu/slim.sh: end"
MODELS=(src/specnoise/assets/models/small-code src/specnoise/assets/models/small-code-sft)
case ${1:-} in
  on)
    if grep -qxF "$BEGIN" "$EXCLUDE" 2>/dev/null; then echo "slim.sh: already on" >&2; exit 1; fi
    if ! git diff --cached --quiet; then echo "slim.sh: changes are staged; commit or unstage them first" >&2; exit 1; fi
    git rm -r -q --cached -- "${MODELS[@]}"
    git ls-files -z -- 'experiments/*.png' | xargs -0 -r git rm -q --cached --
    mkdir -p "$(dirname "$EXCLUDE")"
    { echo "$BEGIN"; for m in "${MODELS[@]}"; do echo "/$m/"; done; echo "/experiments/**/*.png"; echo "$END"; } >> "$EXCLUDE"
    echo "slim.sh: on ($(git ls-files -z | du -cb --apparent-size --files0-from=- | tail -1 | cut -f1) bytes tracked);" \
         "run 'bash experiments/gpu/slim.sh off' after the call, before any commit"
    ;;
  off)
    if ! grep -qxF "$BEGIN" "$EXCLUDE" 2>/dev/null; then echo "slim.sh: not on" >&2; exit 1; fi
    git reset -q HEAD -- "${MODELS[@]}" experiments
    sed -i "\\|^$BEGIN\$|,\\|^$END\$|d" "$EXCLUDE"
    echo "slim.sh: off"
    ;;
  *) echo "usage: bash experiments/gpu/slim.sh on|off" >&2; exit 2 ;;
esac
