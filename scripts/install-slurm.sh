#!/usr/bin/env bash
# Install what the local test cluster needs from Debian's (or Ubuntu's) packages: Slurm's controller,
# node daemon and client, and munge. Safe to run again: does nothing when all are present.
# WITH_ACCOUNTING=1 adds slurmdbd and MariaDB; WITH_SLURM_ROOTS=1 adds debootstrap, which builds the
# roots that hold other Slurm releases (`slurm-preempt testcluster roots`).
set -euo pipefail
packages=(slurmctld slurmd slurm-client munge)
[ "${WITH_ACCOUNTING:-0}" = 1 ] && packages+=(slurmdbd mariadb-server)
[ "${WITH_SLURM_ROOTS:-0}" = 1 ] && packages+=(debootstrap)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-slurm: ${packages[*]} already installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-slurm: need root to install: ${missing[*]}" >&2
  exit 1
fi
echo "install-slurm: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The packages' own services are not wanted (the test cluster runs its own daemons); where systemd
# runs, policy-rc.d keeps the postinst scripts from starting them.
printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
trap 'rm -f /usr/sbin/policy-rc.d' EXIT
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# dpkg, not `sinfo --version`: without a slurm.conf (a fresh machine, a container) sinfo 22.05 tries a
# configless fetch and dies instead of printing its version.
echo "install-slurm: done (slurm-client $(dpkg-query -W -f='${Version}' slurm-client))"
