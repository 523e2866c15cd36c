#!/bin/bash
# Compile syncviz's C++ recording hooks (syncviz/record/native/*.cpp) against the headers of other
# torch releases, syntax only, with the C++ standard each release's own extension builder uses.
# A user's torch builds them on their machine; a release whose headers reject them gets the Python
# hooks (same rows, more overhead), so check here before changing the sources.
#
#   bash benchmarks/native_headers.sh [VERSION ...]     # default: 2.4.1 ... 2.14.1
#
# Downloads each torch wheel (--no-deps, ~0.5-0.9 GB, from the configured index) into
# ${NATIVE_HEADERS_DIR:-/tmp/syncviz-torch-headers}/VERSION, keeps only its headers, and prints one
# line per source: VERSION FILE (STANDARD): ok | the compiler's first error. Exit status 1 if any failed.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
root=${NATIVE_HEADERS_DIR:-/tmp/syncviz-torch-headers}
versions=${*:-2.4.1 2.5.1 2.6.0 2.7.1 2.8.0 2.9.1 2.10.0 2.11.0 2.12.1 2.13.0 2.14.1}
pyinc=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
status=0
for v in $versions; do
  d=$root/$v
  if [ ! -f "$d/complete" ]; then
    rm -rf "$d" && mkdir -p "$d"
    if ! (cd "$d" && python -m pip download -q "torch==$v" --no-deps -d . >/dev/null 2>&1 \
          && unzip -q -o torch-*.whl 'torch/include/*' 'torch/utils/cpp_extension.py' && rm -f torch-*.whl); then
      echo "$v: could not download torch $v for this Python"; status=1; continue
    fi
    touch "$d/complete"
  fi
  std=c++17
  grep -q "'-std=c++20'" "$d/torch/utils/cpp_extension.py" && std=c++20
  for src in "$here"/syncviz/record/native/*.cpp; do
    if err=$(g++ -std=$std -fsyntax-only -DTORCH_EXTENSION_NAME=syncviz_check -DTORCH_API_INCLUDE_EXTENSION_H \
               -isystem "$d/torch/include" -isystem "$d/torch/include/torch/csrc/api/include" -isystem "$pyinc" \
               "$src" 2>&1); then
      echo "$v $(basename "$src") ($std): ok"
    else
      echo "$v $(basename "$src") ($std): $(grep -m1 'error' <<<"$err")"; status=1
    fi
  done
done
exit $status
