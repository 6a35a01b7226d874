#!/usr/bin/env bash
# Set up .venv, then open the course: JupyterLab on the learner notebooks in phases/.
# Usage: bash scripts/course.sh [extra jupyter lab args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1
exec jupyter lab phases/ "$@"
