#!/usr/bin/env bash
# Installs what the test command (scripts/test.sh) needs on a fresh machine of this
# kind (Debian, Rust stable, root), and nothing that is already there: Debian's packages
# (after `apt-get update`, only when one is missing) and the conformance and fuzzing
# tools from crates.io at pinned versions.
set -euo pipefail

export DEBIAN_FRONTEND=noninteractive
export PATH="$HOME/.cargo/bin:$PATH"

# git, tar, python3 and node/npm drive the integration tests; capnproto lets
# scripts/check-capnp.sh check the committed generated code against the schema;
# bubblewrap makes the Linux backend's sandboxes (runtimes); jq, ripgrep, patch and
# bsdextrautils (column) are commands of the shell backend's differential test, run
# by real bash for comparison; python3-venv holds the MCP client below.
packages=(git tar python3 python3-venv ca-certificates capnproto bubblewrap jq ripgrep patch
  bsdextrautils)
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-test-deps: installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

install_tool() {
  local name="$1" version="$2"
  if ! "$name" --version 2>/dev/null | grep -q "$version"; then
    echo "install-test-deps: installing $name $version"
    cargo install "$name" --version "$version" --locked --quiet
  fi
}
install_tool pjdfstest 0.2.2
install_tool fsx 0.3.2
# The fuzz smoke run (scripts/fuzz-smoke.sh) builds its targets with cargo-fuzz.
install_tool cargo-fuzz 0.13.2

# computerd/tests/mcp.rs drives `computerd mcp` as an agent host would, with the official
# Python MCP SDK (PyPI `mcp`, pinned), in a virtual environment of its own.
mcp_venv="${COMPUTER_MCP_VENV:-$HOME/.cache/computer/mcp-venv}"
if ! "$mcp_venv/bin/python" -c 'import mcp' 2>/dev/null; then
  echo "install-test-deps: installing the Python MCP SDK into $mcp_venv"
  python3 -m venv "$mcp_venv"
  "$mcp_venv/bin/pip" install --quiet --disable-pip-version-check 'mcp==2.3.0'
fi
