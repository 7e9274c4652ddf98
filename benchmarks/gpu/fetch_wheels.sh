#!/usr/bin/env bash
# Wheels for a GPU machine that cannot reach PyPI (Python 3.12, x86-64): Leyline's light
# dependencies, into .whl/ (git-ignored). Carry them: run(command="bash benchmarks/gpu/run.sh", carry=[".whl"]).
# SGLang itself cannot travel this way: with its CUDA stack it is ~11 GB.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl pydantic
ls -la .whl
