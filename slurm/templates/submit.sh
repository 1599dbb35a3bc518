#!/bin/bash
# eagle-batch by hand: prepare (waits for it), the extraction array, then training after it (afterok).
# Rendered by slurm/render.py next to the job scripts it submits.
#
#   submit.sh                    prepare + extract (all tasks) + train
#   submit.sh --no-train         prepare + extract
#   submit.sh --no-prepare       extract + train on an already prepared run
#   submit.sh --no-prepare --tasks 3,7 --no-train    resubmit some tasks only (e.g. after fixing a node)
#
# Each array is recorded in RUN/slurm/submissions.jsonl exactly as `eagle-batch extract` records its
# own, and its logs go where submitit would put them (RUN/slurm/<job>_<index>/), so
# `eagle-batch status RUN`, `resume RUN` and `cancel RUN` work on hand-submitted runs too.
set -euo pipefail
# shellcheck source=/dev/null
. @ENV_FILE@

prepare=1
train=1
task_list=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --no-prepare) prepare=0 ;;
        --no-train) train=0 ;;
        --tasks) task_list="${2:?--tasks needs a comma-separated list of task ids}"; shift ;;
        -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "submit.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

cd "${EB_OUT_DIR}"

if [[ "${prepare}" == 1 ]]; then
    eb_log "prepare: sbatch --wait ${EB_OUT_DIR}/prepare.sbatch"
    # --wait: the array size comes from the plan that prepare writes.
    if ! sbatch --wait --parsable prepare.sbatch >/dev/null; then
        echo "submit.sh: prepare failed; see the last ${EB_OUT_DIR}/prepare-*.out" >&2
        exit 1
    fi
fi
plan="${EB_RUN_DIR}/prepared/plan.json"
if [[ ! -f "${plan}" ]]; then
    echo "submit.sh: ${plan} does not exist; prepare failed (log: ${EB_OUT_DIR}/prepare-*.out)" >&2
    exit 1
fi
num_tasks="$(grep -o '"num_tasks": *[0-9]*' "${plan}" | grep -o '[0-9]*$')"
if [[ -z "${task_list}" ]]; then
    task_list="$(seq -s, 0 $((num_tasks - 1)))"
fi
IFS=',' read -r -a tasks <<<"${task_list}"
for t in "${tasks[@]}"; do
    if [[ ! "${t}" =~ ^[0-9]+$ || "${t}" -ge "${num_tasks}" ]]; then
        echo "submit.sh: task '${t}' is not in 0..$((num_tasks - 1)) (the plan has ${num_tasks} tasks)" >&2
        exit 2
    fi
done
n="${#tasks[@]}"

# EB_TASK_LIST is ':'-separated because --export splits its value on commas.
# Held until its log folders exist: Slurm does not create the folder of --output/--error, and the
# folders follow submitit's layout (RUN/slurm/<array>_<index>/) that `eagle-batch status` reads.
array="$(sbatch --parsable --hold --array="0-$((n - 1))%${EB_ARRAY_PARALLELISM}" \
    --export="ALL,EB_TASK_LIST=${task_list//,/:}" extract.sbatch)"
array="${array%%;*}"
for ((i = 0; i < n; i++)); do mkdir -p "${EB_RUN_DIR}/slurm/${array}_${i}"; done
scontrol release "${array}"
printf '{"job_id": "%s", "executor": "slurm", "tasks": [%s], "time": %s, "kind": "extract", "folder": "%s", "dependency": ""}\n' \
    "${array}" "${task_list//,/, }" "$(date +%s)" "${EB_RUN_DIR}/slurm" >>"${EB_RUN_DIR}/slurm/submissions.jsonl"
eb_log "extraction array ${array}: tasks ${task_list} (logs ${EB_RUN_DIR}/slurm/${array}_*/)"

if [[ "${train}" == 1 ]]; then
    job="$(sbatch --parsable --dependency="afterok:${array}" train.sbatch)"
    job="${job%%;*}"
    printf '{"job_id": "%s", "executor": "slurm", "tasks": [], "time": %s, "kind": "train", "folder": "%s", "dependency": "afterok:%s"}\n' \
        "${job}" "$(date +%s)" "${EB_OUT_DIR}" "${array}" >>"${EB_RUN_DIR}/slurm/submissions.jsonl"
    eb_log "training job ${job} starts after ${array} succeeds (log ${EB_OUT_DIR}/train-${job}.out)"
fi
echo "${array}"
