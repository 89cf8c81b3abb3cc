# shellcheck shell=bash
# Shared by start.sh and stop.sh (sourced, not run): where the run directory is, and how a
# daemon recorded in a pid file is recognised. Only processes recorded in pid files under the
# run directory are ever signalled, so other users' daemons on the machine are never touched.

SLURM_LOCAL_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

# The run directory: the first argument if given, else $SLURM_LOCAL_DIR, else runs/slurm-local.
slurm_local_run_dir() {
    local dir="${1:-${SLURM_LOCAL_DIR:-$SLURM_LOCAL_REPO/runs/slurm-local}}"
    mkdir -p "$dir"
    (cd "$dir" && pwd)
}

# Where the private munged of RUN_DIR keeps key, socket, pid and log. It lives under /run/munge
# rather than in RUN_DIR because the munge user must reach it, and run directories are often
# private (pytest's are mode 0700); a hash of the path keeps clusters apart and the socket
# path short (unix socket paths are limited to 107 characters).
munge_dir_of() {
    echo "/run/munge/local-$(echo "$1" | md5sum | cut -c1-12)"
}

# Print the pid in FILE if that process is alive and its command name is NAME.
# A stale pid file whose pid was reused by another program does not match.
pid_of() {
    local file="$1" name="$2" pid comm
    [ -s "$file" ] || return 1
    pid="$(tr -dc '0-9' <"$file")"
    [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] || return 1
    comm="$(cat "/proc/$pid/comm" 2>/dev/null)" || return 1
    [ "$comm" = "$name" ] || return 1
    echo "$pid"
}

# Log to stderr with the script's name, so stdout stays for the final summary.
say() {
    echo "slurm/local/$(basename "$0"): $*" >&2
}
