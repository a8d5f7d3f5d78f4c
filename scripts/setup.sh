#!/usr/bin/env bash
# Set up everything on a fresh Debian/Ubuntu machine (as root): Slurm and munge from the distribution's
# packages, the Debian packages the tests use, a virtual environment in .venv with slurm-preempt and
# its dev tools. Stops at the first thing that fails, with its own error and what to do.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-slurm.sh

# Debian packages beside Slurm: python3-venv for .venv; the tests' tools (rsvg-convert renders the
# timeline picture in tests/test_timeline.py; prometheus and promtool scrape the watcher's metrics and
# check etc/prometheus/ in tests/test_metrics.py). Under CI=true a test missing one fails (tests/conftest.py).
packages=(librsvg2-bin prometheus)
python3 -c 'import venv, ensurepip' 2>/dev/null || packages+=(python3-venv python3-pip)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need root to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
if ! .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1; then
  echo "setup: could not upgrade pip; going on with $(.venv/bin/python -m pip --version | cut -d' ' -f1-2)"
fi
# pip's own error is what tells the cause: show it and stop (a half-installed .venv only fails later,
# with a message about a missing .venv/bin/slurm-preempt).
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! .venv/bin/python -m pip install -q -e ".[dev,metrics]" >"$log" 2>&1; then
  sed '/^WARNING: Location/d' "$log" >&2
  echo "setup: pip could not install slurm-preempt and its dev tools into .venv (its error is above):" \
       "check that PyPI is reachable and python3 is 3.10+, then run scripts/setup.sh again" >&2
  exit 1
fi
sed '/^WARNING: Location/d' "$log"
.venv/bin/slurm-preempt --version
