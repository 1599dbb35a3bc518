#!/usr/bin/env bash
# Same-machine A/B of the store's ingest ceiling: lab/ingest_probe.py (WriterThread -> TaskStoreWriter,
# no engine) with the eagle_batch of REV ("before") and of the working tree ("after"), alternated ROUNDS times,
# 8 GB each into /dev/shm, no fsync. Needs no vLLM: only the bundle's small wheels (zarr, numcodecs, crc32c,
# omegaconf) and the pool of real rows. Prepare here, then run on the device in one call:
#   bash lab/ingest_ab.sh --prepare REV      # writes .ab/ (ignored): REV's eagle_batch + the pool
#   device: carry [".ab", ".device-bundle/tail/extra"], command: bash lab/ingest_ab.sh
set -u
if [ "${1:-}" = --prepare ]; then
  rev=${2:?REV}
  grep -q "^/.ab/" .git/info/exclude || echo "/.ab/" >> .git/info/exclude
  rm -rf .ab && mkdir -p .ab/before && git archive "$rev" eagle_batch | tar -x -C .ab/before
  cp "${POOL:-scratch/pool.npz}" .ab/pool.npz
  exit 0
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .device-bundle/tail/extra/*.whl >/dev/null 2>&1 || { echo "pip install of the bundle's small wheels failed"; exit 1; }
echo "cpus $(nproc)"
for i in $(seq "${ROUNDS:-3}"); do
  for v in before after; do
    if [ $v = before ]; then d=$PWD/.ab/before; else d=$PWD; fi
    mkdir -p "/tmp/o-$v-$i"; rm -rf /dev/shm/tmp*
    PYTHONPATH=$d:/tmp/site OUT=/tmp/o-$v-$i PROBE_IO=8 PROBE_GB=8 timeout 60 \
      python3 lab/ingest_probe.py .ab/pool.npz /dev/shm >/dev/null 2>"/tmp/err-$v-$i.txt"
    echo "$v $i $(python3 -c "import json; print(json.dumps(json.load(open('/tmp/o-$v-$i/ingest.json'))['runs'][0]))" 2>&1 | tail -1)"
  done
done
