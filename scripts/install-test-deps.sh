#!/usr/bin/env bash
# System tools the graph and browser tests use: graphviz (`dot`), Debian's chromium (driven by
# playwright, never downloaded), and the mermaid npm package (a real parser for our mermaid).
# Without them those tests skip with a reason; CI (LIFECYCLE_REQUIRE_ALL=1) fails instead.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v dot >/dev/null 2>&1 || need_apt+=(graphviz)
[[ -x /usr/bin/chromium ]] || need_apt+=(chromium)
if ((${#need_apt[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "installing ${need_apt[*]} (apt-get)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
  else
    echo "note: ${need_apt[*]} missing and not root/Debian: those tests will skip" >&2
  fi
fi
if [[ ! -d node_modules/mermaid ]]; then
  if command -v npm >/dev/null 2>&1; then
    echo "installing mermaid (npm ci)"
    npm ci --silent --no-audit --no-fund
  else
    echo "note: npm missing: the mermaid parser test will skip" >&2
  fi
fi
