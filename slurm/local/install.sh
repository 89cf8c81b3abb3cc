#!/usr/bin/env bash
# Install the packages of the local SLURM test cluster: Debian's slurm-wlm (22.05) and munge.
# Idempotent and quick when everything is present (no apt-get call at all then).
# Installing needs root (apt-get), or sudo without a password. Without either it installs
# nothing, prints the one command to run as root and exits 0: the CPU stack and the main job
# need no SLURM, and the SLURM tests then fail naming that command (they are not skipped).
# Called by scripts/install.sh and .ci/run before the integration tests.
#
#   bash slurm/local/install.sh                 install when missing
#   bash slurm/local/install.sh --root-command  print the command that installs them as root
set -euo pipefail

readonly ROOT_COMMAND="apt-get update && apt-get install -y --no-install-recommends slurm-wlm munge"

if [ "${1:-}" = --root-command ]; then
    echo "$ROOT_COMMAND"
    exit 0
fi

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

as_root=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        as_root=(sudo -n)
    else
        echo "slurm/local/install.sh: not root and no password-less sudo: the local SLURM test cluster is NOT installed" \
             "(the CPU stack and \`megatron-pc train\` do not need it; the SLURM tests will fail until it is). As root, run:"
        echo "  $ROOT_COMMAND"
        exit 0
    fi
fi

# Other users of the machine may hold the dpkg lock for a while; wait instead of failing.
apt_opts=(-o DPkg::Lock::Timeout=300)
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${apt_opts[@]}" install -y -q --no-install-recommends slurm-wlm munge

for cmd in "${needed[@]}"; do
    command -v "$cmd" >/dev/null 2>&1 || { echo "slurm/local/install.sh: $cmd still missing after install" >&2; exit 1; }
done
echo "slurm/local/install.sh: installed $(slurmctld -V)"
