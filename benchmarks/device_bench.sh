#!/usr/bin/env bash
# The training benchmarks on a GPU machine (and on its CPU), as run for RESULTS-train.md.
# Usage: benchmarks/device_bench.sh OUT_DIR [smoke|gpu|quality|cpu|compile|all]
# Needs a python3 with torch, lightning and pandas ($PYTHON to choose another) and, for
# `quality`, the text at out/train-bench/tinyshakespeare.txt.
set -u
out=${1:?output folder}
what=${2:-all}
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
want() { [[ $what == "$1" || $what == all ]]; }
quiet() { grep -v '^  '; }  # the JSON summary goes to files; keep the per-rep lines
$py - <<'PY'
import os, sys, torch, lightning, pandas
print(sys.version.split()[0], "torch", torch.__version__, "lightning", lightning.__version__,
      "pandas", pandas.__version__, "cuda", torch.cuda.is_available(), os.cpu_count(), "cpus")
if torch.cuda.is_available():
    print(torch.cuda.get_device_name(0))
PY
if want smoke; then  # the CLI on the GPU with precision auto, then with torch.compile
  timeout 120 $py -m blockviz train --preset tiny --max_steps 60 --accelerator gpu \
    --store /tmp/smoke/blockviz.db --no_progress
  timeout 200 $py -m blockviz train --preset tiny --max_steps 60 --accelerator gpu --compile true \
    --store /tmp/smoke/blockviz.db --no_progress
  $py -m blockviz runs --store /tmp/smoke/blockviz.db
fi
if want gpu; then
  timeout 240 $py benchmarks/bench_train.py --accelerator gpu --precision auto --steps 400 \
    --reps 3 --out "$out/gpu.json" 2>&1 | quiet
fi
if want quality; then
  timeout 300 $py benchmarks/bench_train.py --reps 0 --accelerator cpu --threads 4 \
    --quality out/train-bench/tinyshakespeare.txt --out "$out/quality_cpu.json" 2>&1 | quiet
fi
if want cpu; then
  timeout 240 $py benchmarks/bench_train.py --accelerator cpu --threads 4 --steps 400 --reps 3 \
    --out "$out/cpu.json" 2>&1 | quiet
fi
if want compile; then
  timeout 240 $py benchmarks/bench_train.py --accelerator gpu --precision auto --compile true \
    --steps 400 --reps 1 --out "$out/gpu_compile.json" 2>&1 | quiet
fi
