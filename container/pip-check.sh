#!/bin/sh
# `pip check` for the image's venv that accepts exactly the lines the installed lock file declares as
# expected ("# pip-check-expected: LINE", which build.sh lock copies from the .in file, where each has
# its reason) and nothing else; an expected line that pip no longer prints fails too, so the
# declaration stays true. A lock without such lines gets a plain `pip check`.
#   sh container/pip-check.sh LOCK
# POSIX sh: Apptainer's %post runs /bin/sh.
set -eu
lock="${1:?usage: pip-check.sh LOCK}"
expected="$(mktemp)"
got="$(mktemp)"
trap 'rm -f "${expected}" "${got}"' EXIT
sed -n 's/^# pip-check-expected: //p' "${lock}" >"${expected}"
rc=0
pip check >"${got}" 2>&1 || rc=$?
if [ ! -s "${expected}" ]; then
    # Nothing expected: pip's own verdict.
    cat "${got}"
    exit "${rc}"
fi
status=0
if grep -vxF -f "${expected}" "${got}" | grep -vx 'No broken requirements found.' >&2; then
    echo "pip-check.sh: pip check printed the lines above, which ${lock} does not expect" >&2
    status=1
fi
if grep -vxF -f "${got}" "${expected}" >&2; then
    echo "pip-check.sh: ${lock} expects the lines above, which pip check no longer prints; drop them from its .in file and re-lock" >&2
    status=1
fi
[ "${status}" = 0 ] && echo "pip check: only the $(wc -l <"${expected}") line(s) ${lock} expects"
exit "${status}"
