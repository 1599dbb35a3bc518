# shellcheck shell=bash
# Functions shared by the rendered job scripts (copied next to them by slurm/render.py, sourced through
# env.sh). Everything site-specific comes from env.sh; nothing here needs editing.

eb_log() { printf '[eagle-batch %s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# Run a Python command line the way the config says: on the host, in Apptainer, or in a pyxis/enroot
# container (srun step). Same invocation as eagle_batch.launch.submit.container_wrapping.
#   eb_python -m eagle_batch prepare CONFIG
eb_python() {
    case "${EB_CONTAINER_RUNTIME}" in
        none | apptainer)
            "${EB_PYTHON[@]}" "$@"
            ;;
        pyxis)
            srun --ntasks=1 --nodes=1 "${EB_SRUN_ARGS[@]}" "${EB_PYTHON[@]}" "$@"
            ;;
        *)
            eb_log "unknown container runtime '${EB_CONTAINER_RUNTIME}' (none | apptainer | pyxis)"
            return 2
            ;;
    esac
}

# The same, replacing the calling (sub)shell: `eb_exec_python ARGS &` makes $! the task's own process
# (or apptainer's/srun's, which forward signals to it). Without the exec, $! is a bash subshell that
# dies of the forwarded SIGUSR2 while the task never sees it.
eb_exec_python() {
    case "${EB_CONTAINER_RUNTIME}" in
        none | apptainer) exec "${EB_PYTHON[@]}" "$@" ;;
        pyxis) exec srun --ntasks=1 --nodes=1 "${EB_SRUN_ARGS[@]}" "${EB_PYTHON[@]}" "$@" ;;
        *)
            eb_log "unknown container runtime '${EB_CONTAINER_RUNTIME}' (none | apptainer | pyxis)"
            exit 2
            ;;
    esac
}

# Task status and failure count from RUN/state/task-XXXXX.json (written by ArrayTask). Parsed with
# grep so that it works on the host even when Python with eagle-batch lives only in the image.
eb_task_field() {  # eb_task_field TASK_ID KEY  -> value or empty
    local f
    f="$(printf '%s/state/task-%05d.json' "${EB_RUN_DIR}" "$1")"
    [[ -f "${f}" ]] || return 0
    grep -m1 -o "\"$2\": *\"\\?[a-z_0-9]*" "${f}" | sed 's/.*: *"\{0,1\}//'
}

# Requeue this array task (keeps its array index; SLURM_RESTART_COUNT increments).
eb_requeue() {
    local jid="${SLURM_ARRAY_JOB_ID:-${SLURM_JOB_ID}}"
    [[ -n "${SLURM_ARRAY_TASK_ID:-}" ]] && jid="${jid}_${SLURM_ARRAY_TASK_ID}"
    eb_log "requeueing ${jid}: $*"
    scontrol requeue "${jid}"
}
