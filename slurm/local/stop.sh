#!/usr/bin/env bash
# Stop the local SLURM cluster that start.sh started from RUN_DIR: cancel its jobs, then stop
# every slurmd, slurmctld and munged recorded in its pid files. Nothing else is signalled.
# Safe to run when nothing is running.
#
# usage: slurm/local/stop.sh [RUN_DIR]   (default: $SLURM_LOCAL_DIR, else <repo>/runs/slurm-local)
set -euo pipefail

# shellcheck source=slurm/local/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# Jobs' processes (slurmstepd and children) outlive slurmd, so cancel jobs while it still runs.
cancel_jobs() {
    local conf="$run_dir/etc/slurm.conf" i jobs
    pid_of "$run_dir/slurmctld.pid" slurmctld >/dev/null && [ -f "$conf" ] || return 0
    export SLURM_CONF="$conf"
    jobs="$(squeue -h -o '%i' 2>/dev/null | paste -sd' ')" || return 0
    [ -n "$jobs" ] || return 0
    say "cancelling jobs $jobs"
    # shellcheck disable=SC2086  # one argument per job id
    scancel $jobs || true
    for i in $(seq 1 20); do
        [ -z "$(squeue -h -t running,completing -o '%i' 2>/dev/null)" ] && return 0
        [ "$i" -lt 20 ] && sleep 0.5
    done
    say "jobs still completing after 10s; stopping anyway"
}

# SIGTERM to every daemon recorded in the given pid files at once (each takes ~2 s to exit),
# wait up to 10 s, then SIGKILL: a daemon that hangs must not keep a test waiting.
# Arguments: NAME FILE [FILE...], NAME being the command name the pid must have.
stop_all() {
    local name="$1" file pid i alive
    shift
    local pids=()
    for file in "$@"; do
        if pid="$(pid_of "$file" "$name")"; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid")
        fi
        rm -f "$file"
    done
    for i in $(seq 1 50); do
        alive=()
        for pid in ${pids[@]+"${pids[@]}"}; do
            if [ -d "/proc/$pid" ]; then alive+=("$pid"); fi
        done
        [ "${#alive[@]}" -eq 0 ] && break
        [ "$i" -lt 50 ] && sleep 0.2
    done
    for pid in ${alive[@]+"${alive[@]}"}; do
        say "$name ($pid) ignored SIGTERM; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    done
    [ "${#pids[@]}" -eq 0 ] || say "stopped $name (${pids[*]})"
}

main() {
    run_dir="$(slurm_local_run_dir "${1:-}")"
    local munge_dir
    cancel_jobs
    stop_all slurmd "$run_dir"/slurmd-*.pid
    stop_all slurmctld "$run_dir/slurmctld.pid"
    # munged last: the slurm daemons may still sign messages while they shut down.
    munge_dir="$(munge_dir_of "$run_dir")"
    stop_all munged "$munge_dir/munged.pid"
    # Keep munged's log with the others, then drop its directory from /run (a tmpfs).
    if [ -d "$munge_dir" ]; then
        mkdir -p "$run_dir/log"
        cp -f "$munge_dir/munged.log" "$run_dir/log/munged.log" 2>/dev/null || true
        rm -rf "$munge_dir" "$run_dir/munge"
    fi
    say "stopped the cluster in $run_dir"
}

main "$@"
