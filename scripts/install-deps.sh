#!/usr/bin/env bash
# Installs the Debian packages that Starling's tests and benchmarks start for real.
# Idempotent: does nothing when every package is already installed.
set -euo pipefail

PACKAGES=(
  ca-certificates iproute2 procps psmisc util-linux
  docker-registry apache2-utils nginx-light
  containerd runc skopeo podman catatonit umoci busybox-static binutils
  golang-go golang-github-containerd-stargz-snapshotter-dev stargz-snapshotter
  fuse3 libfuse3-dev pkg-config attr
  curl ethtool aria2 opentracker mktorrent
  postgresql debootstrap
  chromium
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  echo "installing Debian packages: ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "Debian packages: all ${#PACKAGES[@]} present"
fi
