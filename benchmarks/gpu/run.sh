#!/usr/bin/env bash
# One prepared check for a lent GPU (H200), ~8 minutes, one markdown table at the end:
#   1. benchmarks/bench_rotate.py on CUDA: the Triton rotate_copy against a plain copy (target >= 70 %);
#   2. SGLang 0.5.23 end to end with the Leyline plugin, a DeepSeek-V2-Lite-shaped model with dummy
#      weights (benchmarks/gpu/sglang_e2e.py): a conversation, an amortize splice, the next request's
#      cached tokens, continue-after-edit latency of splice vs forget at 8k and 32k downstream tokens.
#
#   bash benchmarks/gpu/run.sh              on the GPU machine (writes $OUT/report.md; OUT defaults to /tmp/leyline-gpu)
#   DRY_RUN=1 bash benchmarks/gpu/run.sh    anywhere: every part that needs no GPU, with CPU stand-ins
#
# Installs what is missing: Leyline's light deps and SGLang from wheels carried in .whl/ (see
# fetch_wheels.sh) or else from PyPI. A part that cannot run shows as "not run" with the reason.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-/tmp/leyline-gpu}"
PY="${PYTHON:-python3}"
BUDGET="${BUDGET_S:-540}"  # the whole script, seconds
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
notes=()
log() { echo "[$(date +%T) +${SECONDS}s] $*"; }
left() { echo $((BUDGET - SECONDS)); }
have() { "$PY" -c "import $1" >/dev/null 2>&1; }
pip_install() {  # carried wheels first, then PyPI, within a time limit
    local limit=$1; shift
    if compgen -G ".whl/*.whl" >/dev/null; then
        "$PY" -m pip install -q --no-index --find-links .whl "$@" && return 0
    fi
    timeout "$limit" "$PY" -m pip install -q --disable-pip-version-check "$@"
}

log "python: $($PY -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>&1)"
have pydantic || pip_install 120 pydantic || notes+=("--note=rotate=pydantic (a Leyline dependency) is not installed and could not be installed")

# 1. rotate_copy vs copy ---------------------------------------------------------------------------
log "rotate benchmark"
if [ -n "${DRY_RUN:-}" ]; then
    timeout 300 "$PY" benchmarks/bench_rotate.py --tokens 256 --repeat 1 | tee "$OUT/rotate-cpu.txt"
    # a CPU has no Triton timing: check the table on the shape of a CUDA run
    printf '%s\n' "mla-v2-lite       8192 copy        1.00      100   100.0    1.00x" \
        "mla-v2-lite       8192 triton      1.20      100   100.0    1.20x" > "$OUT/rotate.txt"
else
    timeout 150 "$PY" benchmarks/bench_rotate.py --tokens 8192 32768 --repeat 10 2>&1 | tee "$OUT/rotate.txt" \
        || notes+=("--note=rotate=bench_rotate.py failed or timed out (see rotate.txt)")
fi

# 2. SGLang end to end -----------------------------------------------------------------------------
if [ -n "${DRY_RUN:-}" ]; then
    log "SGLang end to end (dry run: config and command line only)"
    "$PY" benchmarks/gpu/sglang_e2e.py --out "$OUT/sglang.json" --dry-run
    printf '%s' '{"startup_s": 95, "backend": "triton", "runs": {"8192": {"amortize": {"conversation_reused": 1543, "conversation_expected": 1543,
        "ttft_ms": 120, "applied": true, "fallback": null, "canary": "passed", "splice_ms": 80, "rotated": 8200,
        "prefilled": 65, "next_cached": 9288, "expected_cached": 9288}, "forget": {"ttft_ms": 900}}}}' > "$OUT/sglang.json"
else
    if ! have sglang; then
        log "installing sglang==0.5.23"
        pip_install $(( $(left) - 330 > 60 ? $(left) - 330 : 60 )) "sglang==0.5.23" \
            || notes+=("--note=e2e=sglang 0.5.23 could not be installed here (it needs PyPI: with its CUDA stack it is ~11 GB, beyond what a run can carry)")
    fi
    if have sglang; then
        log "SGLang end to end ($(left) s left)"
        timeout $(( $(left) - 20 )) "$PY" benchmarks/gpu/sglang_e2e.py --out "$OUT/sglang.json" \
            --attention-backend "${ATTN_BACKEND:-triton}" 2>&1 | tee "$OUT/sglang.log" | tail -n 40
        [ -s "$OUT/sglang.json" ] || notes+=("--note=e2e=the run failed or timed out (see sglang.log)")
    fi
fi

# 3. the table -------------------------------------------------------------------------------------
"$PY" benchmarks/gpu/report.py --rotate "$OUT/rotate.txt" --e2e "$OUT/sglang.json" "${notes[@]}" | tee "$OUT/report.md"
log "done: $OUT/report.md"
