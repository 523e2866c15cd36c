#!/usr/bin/env bash
# Debian's libaio-dev: DeepSpeed builds its async_io op (ZeRO-Infinity's NVMe swapping) against it.
set -euo pipefail
if dpkg -s libaio-dev >/dev/null 2>&1; then exit 0; fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q libaio-dev >/dev/null
