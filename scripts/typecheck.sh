#!/usr/bin/env bash
# mypy sees the installed layout (probes/ as tailsight.probes, ...) through a tree of symlinks,
# since the editable install maps folders with an import hook mypy cannot follow.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
tree=build/typecheck
rm -rf "$tree" && mkdir -p "$tree/tailsight"
for entry in tailsight/*; do
    [ "$(basename "$entry")" = __pycache__ ] || ln -s "$repo/$entry" "$tree/tailsight/"
done
for subpackage in probes collector analysis dashboards trading_core; do
    ln -s "$repo/$subpackage" "$tree/tailsight/$subpackage"
done
cd "$tree"
status=0
"$repo/.venv/bin/mypy" --config-file "$repo/pyproject.toml" -p tailsight > mypy.out || status=$?
# Report paths as they are in the repository.
sed -E 's#^tailsight/(probes|collector|analysis|dashboards|trading_core)/#\1/#' mypy.out
exit $status
