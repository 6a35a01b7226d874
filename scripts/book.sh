#!/usr/bin/env bash
# Build the course as a static site into _build/book/ (open _build/book/index.html): every phase from its
# learner notebook (phases/) with the Mini build executed, every guide in docs/, a search box. Offline: the
# build fetches nothing (set-up, run first as by the other scripts, is what uses the package index).
# Usage: bash scripts/book.sh [python -m book build options, e.g. --execute none | --execute 01,05 | --out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m book build "$@"
