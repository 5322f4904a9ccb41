#!/usr/bin/env bash
# Rebuild the prebuilt JupyterLab extension (jdist/labextension/) from labextension/ with jlpm, and the
# notebook dashboard's bundle (jdist/kernel/dashboard/charts.js, charts.css) with rspack,
# then record the sources' hash next to it (tests check that the committed build is current).
# Needs node >= 18 on PATH; jlpm, jupyter and @jupyter/builder come from the venv and yarn.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
export PATH="$PWD/$VENV/bin:$PATH"
command -v node >/dev/null || { echo "node is needed to build the labextension (users of the wheel do not need it)"; exit 1; }
cd labextension
# with CI=true yarn refuses to change yarn.lock (it must be committed up to date)
jlpm install
jlpm build:prod
# the notebook's live dashboard: one ES module and its CSS, loaded by the kernel's widget
node build-dashboard.js
cat style/charts.css style/dashboard.css > ../jdist/kernel/dashboard/charts.css
cd ..
# the build empties the output folder; install.json tells `jupyter labextension list` the package
cp labextension/install.json jdist/labextension/install.json
python3 tools/labextension_hash.py --write
# a development venv serves this checkout's build (pip copied the output at install time)
if [ -d "$VENV/share/jupyter/labextensions" ] && [ ! -L "$VENV/share/jupyter/labextensions/jdist" ]; then
  rm -rf "$VENV/share/jupyter/labextensions/jdist"
  ln -s "$PWD/jdist/labextension" "$VENV/share/jupyter/labextensions/jdist"
fi
