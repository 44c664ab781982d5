#!/usr/bin/env bash
# Re-fetch the admin pages' vendored browser libraries (htmx, uPlot) at exactly the
# versions pinned in llmgw/server/pages/static/vendor/VERSIONS with `npm pack`, and check
# that both the fetched files and the copies in the tree match the sha256s listed there.
# Exits non-zero on any mismatch or fetch failure. Needs npm; writes only to a temp dir.
#
#   packaging/vendor-pages.sh
#
# To move to a new version: npm pack it, copy the files over, rewrite their VERSIONS rows
# (sha256sum), then run this script.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
vendor="$root/llmgw/server/pages/static/vendor"
versions="$vendor/VERSIONS"
[ -f "$versions" ] || { echo "vendor-pages: $versions missing" >&2; exit 2; }
command -v npm >/dev/null || { echo "vendor-pages: npm not found" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail=0
declare -A unpacked=()
while read -r file pkg src sha; do
  case "$file" in ''|'#'*) continue;; esac
  if [ -z "$sha" ]; then echo "vendor-pages: malformed VERSIONS row for $file" >&2; exit 2; fi
  dir="$tmp/${pkg//[@\/]/_}"
  if [ -z "${unpacked[$pkg]:-}" ]; then
    mkdir -p "$dir"
    tgz=$(cd "$dir" && npm pack --silent "$pkg" | tail -n 1)
    tar -xzf "$dir/$tgz" -C "$dir"
    unpacked[$pkg]=1
  fi
  got=$(sha256sum "$dir/package/$src" | cut -d' ' -f1)
  have=$(sha256sum "$vendor/$file" 2>/dev/null | cut -d' ' -f1 || true)
  if [ "$got" != "$sha" ]; then
    echo "MISMATCH $file: npm $pkg $src has $got, VERSIONS says $sha" >&2; fail=1
  elif [ "$have" != "$sha" ]; then
    echo "MISMATCH $file: vendored copy has ${have:-<missing>}, VERSIONS says $sha" >&2; fail=1
  else
    echo "ok $file ($pkg $src)"
  fi
done < "$versions"

exit "$fail"
