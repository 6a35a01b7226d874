#!/usr/bin/env bash
# Build the course as a static site into _build/book/ (open _build/book/index.html): every phase from its
# learner notebook (phases/) with the Mini build executed, every guide in docs/, a search box.
# The build fetches nothing. Set-up (scripts/setup.sh, the only step that uses the package index) runs first
# when .venv lacks what the build needs, so on a machine already set up the whole command works offline.
# Usage: bash scripts/book.sh [python -m book build options, e.g. --execute none | --execute 01,05 | --out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
if ! .venv/bin/python -c "import mini, labs, markdown_it, nbclient, nbformat, pygments, ipykernel, matplotlib" \
        2>/dev/null; then
    bash scripts/setup.sh
fi
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m book build "$@"
