#!/usr/bin/env bash
# The device checks in one run, on a lent GPU machine (tool `device`: a bare image with
# torch, no network): the wheels the image lacks travel in .whl/ (msgspec, py-spy; see
# README "Development"). What comes back under $OUT (8 files at most): the table of
# bench/gpu_check.py (NVML fields, nccl op names, a collective pending behind GPU work),
# and a real NCCL watchdog timeout (probes/nccl_watchdog.py) with its Flight Recorder dump
# and what `ddptop doctor` says of it: from the job's record, and from the dump and the log
# alone (the post-mortem path of a job never run under ddptop).
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
nvidia-smi -L; python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available(), torch.cuda.nccl.version())"
MASTER_ADDR=127.0.0.1 MASTER_PORT=29555 RANK=0 WORLD_SIZE=1 timeout 60 python3 -c "
import json, torch, torch.distributed as d; torch.cuda.set_device(0); d.init_process_group('nccl')
x = torch.ones(8, device='cuda'); d.all_reduce(x); torch.cuda.synchronize(); c = torch._C._distributed_c10d
for n in ('_dump_nccl_trace_json', '_dump_fr_trace_json'):
    f = getattr(c, n, None); print('FR default:', n, f and len(json.loads(f(includeCollectives=True, onlyActive=False)).get('entries', [])))
d.destroy_process_group()"
timeout 240 python3 bench/gpu_check.py --out /tmp/gc --busy 10 > "$OUT/gpu_check.txt" 2>&1; echo "gpu_check rc=$?"
tar czf "$OUT/gpu_check_files.tgz" -C /tmp gc; cat "$OUT/gpu_check.txt"
export DDPTOP_RUNTIME_DIR=/tmp/rt TORCH_NCCL_DUMP_ON_TIMEOUT=1 TORCH_FR_BUFFER_SIZE=2000
timeout 150 python3 -m ddptop launch --job-id wd --interval 0.5 -- python3 -m torch.distributed.run \
  --standalone --nproc-per-node 1 probes/nccl_watchdog.py > "$OUT/watchdog.log" 2>&1; echo "watchdog rc=$?"
ls -la /tmp/rt/jobs/wd/; cp /tmp/rt/jobs/wd/fr_trace_rank_0 "$OUT/" 2>/dev/null
grep -n "Watchdog\|WorkNCCL\|queued\|ddptop" "$OUT/watchdog.log" | head -20
python3 -m ddptop doctor --json wd > "$OUT/doctor_job.json" 2>&1; echo "doctor job rc=$?"
python3 -m ddptop doctor "$OUT/fr_trace_rank_0" "$OUT/watchdog.log" > "$OUT/doctor_evidence.txt" 2>&1
echo "doctor evidence rc=$?"; head -c 2500 "$OUT/doctor_job.json"; echo; cat "$OUT/doctor_evidence.txt"
