#!/usr/bin/env bash
# The prepared GPU checks of issue #43, for a session lent a GPU machine (device tool `run`).
# Run from the repository root there, with the pykeops wheels carried in .whl (see below):
#
#   bash scripts/gpu-check.sh kernels   # bench kernels --device cuda: roofline, KeOps, loop (~3 min)
#   bash scripts/gpu-check.sh tests     # Triton compiled on the card, pytest -m gpu methods (~3 min)
#   bash scripts/gpu-check.sh paths     # every key and auto through gpscale fit on CUDA (~6 min)
#   bash scripts/gpu-check.sh fits      # 2e6-row file -> svgp / solvegp / softki, 60 s each, then
#                                       # 10^6 predictions each (bench scale; ~5 min)
#   bash scripts/gpu-check.sh table [protein keggu mnist ggp]   # the rest of the GPU table,
#                                       # defaults, svgp beside cagp-opt (minutes per row)
#   bash scripts/gpu-check.sh sweep     # the Triton sweep alone (n = 100,000; ~4 min)
#   bash scripts/gpu-check.sh conv      # convolutional rows on the card: MNIST conv-SOLVE-GP
#                                       # M+M vs conv-SVGP M, 2M at the paper's stride 1; then,
#                                       # where $GPSCALE_DATA has cifar-10-batches-bin, CIFAR-10
#                                       # with Table 1's settings for 10 minutes (~15 min)
#   bash scripts/gpu-check.sh deep      # two-layer deep conv GPs on MNIST at the paper's sizes
#                                       # (Table 5, stride 1); then CIFAR-10 with Table 3's
#                                       # two-layer SOLVE-GP for 10 minutes (~20 min)
#   bash scripts/gpu-check.sh tune      # the sweep (n = 100,000), then `kernels` with its choice,
#                                       # kept in /tmp/gpscale-triton.env for later steps (~6 min)
#
# Each step writes into $OUT (the device tool brings it back) or runs/gpu-check. The wheels:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps -d .whl pykeops==2.3 keopscore==2.3   # sdists, then
#   .venv/bin/python -m pip wheel --no-deps .whl/*.tar.gz -w .whl && rm .whl/*.tar.gz
# and `carry: [".whl"]` in the run call. The machine's python3 has torch, triton, gpytorch.
set -uo pipefail
step=${1:?usage: gpu-check.sh kernels|sweep|tune|tests|paths|fits|table|conv|deep}
out=${OUT:-runs/gpu-check}
mkdir -p "$out"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/site
fi
chosen=/tmp/gpscale-triton.env  # the sweep's choice: GPSCALE_TRITON_* settings, one per line
if [ -f "$chosen" ] && [ "$step" != tune ]; then
    set -a; . "$chosen"; set +a; echo "Triton settings from the sweep:"; cat "$chosen"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/card.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" \
    | tee -a "$out/card.txt"
case $step in
kernels)
    python3 -m gpscale bench kernels --device cuda --out "$out/kernels" 2>&1 | tee "$out/kernels.log"
    ;;
tests)
    python3 -m pytest -q -p no:cacheprovider tests/linalg/test_triton.py \
        tests/linalg/test_triton_symmetric.py tests/test_devices.py 2>&1 | tee "$out/tests.log"
    python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_cuda_methods.py \
        tests/test_kernels.py 2>&1 | tee -a "$out/tests.log"
    ;;
paths)
    python3 -m pytest -q -p no:cacheprovider -rA -m gpu tests/test_cuda_cli_paths.py 2>&1 \
        | tee "$out/paths.log"
    ;;
fits)
    # 2e6-row 8-D file -> svgp / solvegp / softki with defaults and 60 s of training, then 10^6
    # fresh predictions each (gpscale bench scale; the file is written once under /tmp/scale)
    python3 -m gpscale bench scale --device cuda --datasets n2m --runs svgp,solvegp,softki \
        --max-time 60 --out /tmp/scale 2>&1 | tee "$out/fits.log"
    cp /tmp/scale/report.md "$out/scale-report.md"
    cp /tmp/scale/results.jsonl "$out/scale-results.jsonl"
    ;;
table)
    # the rest of the GPU table (issue #43 item 4), each with defaults; minutes each: run the
    # rows a session has time for, e.g. `bash scripts/gpu-check.sh table protein`
    for row in ${2:-protein keggu mnist ggp}; do
        case $row in
        protein|keggu)
            for key in cagp-opt svgp; do
                python3 -m gpscale fit --dataset "$row" --method "$key" --device cuda \
                    --out "/tmp/table-$row-$key" --no-progress 2>&1 | tail -n 20 \
                    | tee -a "$out/table.log"
            done ;;
        mnist)
            python3 -m gpscale fit --dataset mnist --method iterncgp --device cuda \
                --out /tmp/table-mnist --no-progress 2>&1 | tail -n 20 | tee -a "$out/table.log" ;;
        ggp)
            python3 -m gpscale bench scale --device cuda --datasets n100m --out /tmp/scale-ggp \
                2>&1 | tee -a "$out/table.log"
            cp /tmp/scale-ggp/report.md "$out/ggp-report.md" ;;
        esac
    done
    ;;
tune)
    timeout 230 python3 - <<'PY' 2>&1 | tee "$out/sweep.log"
import json, logging, os, torch
from gpscale.benchmarks.kernels_gpu import sweep
logging.basicConfig(level=logging.INFO, format="%(message)s")
rows = sweep(torch.device("cuda"))
json.dump(rows, open(os.path.join(os.environ.get("OUT", "runs/gpu-check"), "sweep.json"), "w"))
chosen = [r for r in rows if r.get("chosen")]
if chosen:
    print("CHOSEN", json.dumps(chosen[0]))
    open("/tmp/gpscale-triton.env", "w").write(chosen[0]["env"].replace(" ", "\n") + "\n")
PY
    if [ -f "$chosen" ]; then set -a; . "$chosen"; set +a; cat "$chosen"; fi
    timeout 240 python3 -m gpscale bench kernels --device cuda --runs triton,keops,loop \
        --out /tmp/kernels 2>&1 \
        | tee "$out/kernels.log"
    cp /tmp/kernels/report.md "$out/kernels-report.md"
    cp /tmp/kernels/results.jsonl "$out/kernels-results.jsonl"
    ;;
sweep)
    python3 - <<'PY' 2>&1 | tee "$out/sweep.log"
import json, os, torch
from gpscale.benchmarks.kernels_gpu import sweep
rows = sweep(torch.device("cuda"))
for row in rows:
    print(json.dumps(row))
json.dump(rows, open(os.path.join(os.environ.get("OUT", "runs/gpu-check"), "sweep.json"), "w"))
PY
    ;;
conv)
    # equal iterations on MNIST at stride 1 (the paper's), the three rows of Table 1's comparison
    for run in "conv-solvegp num_inducing=384 num_orthogonal=384" "conv-svgp num_inducing=384" \
               "conv-svgp num_inducing=768"; do
        set -- $run; key=$1; shift; opts=(); for o in "$@"; do opts+=(-o "$o"); done
        python3 -m gpscale fit --dataset mnist --method "$key" "${opts[@]}" -o stride=1 \
            --device cuda --epochs 5 --out "$out/conv-mnist-$key-${1#num_inducing=}" \
            --overwrite --no-progress 2>&1 | tail -n 25 | tee -a "$out/conv.log"
    done
    if python3 -c "from gpscale.data.datasets import load_dataset as l; l('cifar10', num_train=2, num_test=1)" 2>/dev/null; then
        # Table 1 (notes/004 §3.2): 1K + 1K inducing patches, 5 x 5 stride 1, TICK, robust-max,
        # Adam 0.003, batch 64; ten minutes instead of 300K iterations
        python3 -m gpscale fit --dataset cifar10 --method conv-solvegp -o num_inducing=1000 \
            -o num_orthogonal=1000 -o stride=1 --lr 0.003 --device cuda --max-time 600 \
            --out "$out/conv-cifar10" --overwrite --no-progress 2>&1 | tail -n 25 \
            | tee -a "$out/conv.log"
    else
        echo "no cifar-10-batches-bin on GPSCALE_DATA: CIFAR-10 skipped" | tee -a "$out/conv.log"
    fi
    ;;
deep)
    # Table 5's two-layer model: 5 x 5 stride 1 with 10 channels, then 4 x 4 stride 2; hidden
    # 384 (+384), output 1K (+1K); the double SVGP 768 / 2K. MNIST for 2 epochs each.
    for run in "conv-solvegp 1000 1000 384 384" "conv-svgp 1000 0 384 0" "conv-svgp 2000 0 768 0"; do
        set -- $run
        python3 -m gpscale fit --dataset mnist --method "$1" -o layers=2 -o stride=1 \
            -o num_inducing="$2" -o num_orthogonal="$3" -o hidden_inducing="$4" \
            -o hidden_orthogonal="$5" --device cuda --epochs 2 \
            --out "$out/deep-mnist-$1-$2-$4" --overwrite --no-progress 2>&1 | tail -n 25 \
            | tee -a "$out/deep.log"
    done
    if python3 -c "from gpscale.data.datasets import load_dataset as l; l('cifar10', num_train=2, num_test=1)" 2>/dev/null; then
        # Table 3 (notes/004 §3.3), two layers, SOLVE-GP; ten minutes instead of 300K iterations
        python3 -m gpscale fit --dataset cifar10 --method conv-solvegp -o layers=2 \
            -o stride=1 -o num_inducing=1000 -o num_orthogonal=1000 -o hidden_inducing=384 \
            -o hidden_orthogonal=384 --lr 0.003 --device cuda --max-time 600 \
            --out "$out/deep-cifar10" --overwrite --no-progress 2>&1 | tail -n 25 \
            | tee -a "$out/deep.log"
    else
        echo "no cifar-10-batches-bin on GPSCALE_DATA: CIFAR-10 skipped" | tee -a "$out/deep.log"
    fi
    ;;
*)
    echo "unknown step $step (kernels, sweep, tune, tests, paths, fits, table, conv or deep)"; exit 2
    ;;
esac
