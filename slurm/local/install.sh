#!/usr/bin/env bash
# Install the packages of the local SLURM test cluster: Debian's slurm-wlm (22.05) and munge.
# Idempotent and quick when everything is present (no apt-get call at all then).
# Needs root (apt-get). Called by .ci/run before the integration tests.
set -euo pipefail

# The binaries the local cluster uses; if all exist there is nothing to do.
needed=(slurmctld slurmd sbatch squeue sinfo scontrol munged munge unmunge)

missing=()
for cmd in "${needed[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
done
if [ "${#missing[@]}" -eq 0 ]; then
    echo "slurm/local/install.sh: slurm-wlm and munge already installed"
    exit 0
fi
echo "slurm/local/install.sh: missing ${missing[*]}; installing slurm-wlm and munge"

if [ "$(id -u)" -ne 0 ]; then
    echo "slurm/local/install.sh: must run as root (apt-get)" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# Other users of the machine may hold the dpkg lock for a while; wait instead of failing.
apt_opts=(-o DPkg::Lock::Timeout=300)
apt-get "${apt_opts[@]}" update -q
apt-get "${apt_opts[@]}" install -y -q --no-install-recommends slurm-wlm munge

for cmd in "${needed[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || { echo "slurm/local/install.sh: $cmd still missing after install" >&2; exit 1; }
done
echo "slurm/local/install.sh: installed $(slurmctld -V)"
