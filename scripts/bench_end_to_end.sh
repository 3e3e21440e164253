#!/usr/bin/env bash
# End to end on a GPU pair: 4,096 ImageNet-like photos written as a folder, the paper's store made from them
# (make prepare's script), the synthetic train step (benchmark.py) against scripts/train.py reading the store with
# worker processes (-1: one per 4 cores) and without, then bench_input's full-size rows and the CPU decoder per thread
# count. Results in $OUT (default ./runs/end_to_end). Run from the repository root: bash scripts/bench_end_to_end.sh
set -u
OUT=${OUT:-runs/end_to_end}
mkdir -p "$OUT"
[ -d .whl ] && python3 -m pip install -q --no-deps .whl/*.whl 2>&1 | tail -1  # the GPU test image's missing wheels
export PYTHONPATH=$PWD TRITON_INTERPRET=0 PYTHONUNBUFFERED=1
echo "cores $(nproc)"
t0=$(date +%s)
python3 -c "import sys; sys.path.insert(0, 'scripts'); import bench_input; bench_input.write_folder('/tmp/photos', 4096)"
echo "folder of 4,096 photos written in $(( $(date +%s) - t0 )) s; $(du -sb /tmp/photos | cut -f1) bytes"
python3 scripts/prepare_data.py --name=folder --data_dir=/tmp/photos --store=/tmp/store 2>&1 | tail -5 | tee $OUT/prepare.txt
python3 scripts/benchmark.py --config configs/alexnet_2gpu.py --systems triton:split --dtypes bfloat16 --batches 512 \
  --json $OUT/benchmark.json 2>&1 | grep -v "MiB\|cross-device" | tail -3
for w in -1 0; do
  timeout 150 python3 scripts/train.py --config configs/alexnet_2gpu.py --workdir /tmp/run$w \
    --config.dataset.name=store --config.dataset.data_dir=/tmp/store --config.dataset.eval_split=validation \
    --config.dataset.workers=$w --config.batch_size=512 --config.dtype=bfloat16 --config.kernel_backend=triton \
    --config.num_epochs=48 --config.log_every_steps=32 --config.eval_every_steps=100000 \
    --config.checkpoint_every_steps=100000 2>&1 | grep -v "it/s\|step/s" | tail -3
  grep '"train"' /tmp/run$w/metrics.jsonl > $OUT/train_workers$w.jsonl
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; print('workers', sys.argv[2], [round(x['steps_per_sec'] * 512) for x in r])" $OUT/train_workers$w.jsonl $w
done
timeout 170 python3 scripts/bench_input.py --images 1024 --threads 16 --workers 0,8 --jpegs 2048 \
  --decode_threads 1,2,4,8,16,32 --json $OUT/bench_input.json 2>&1 | tail -22
