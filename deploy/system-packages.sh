#!/usr/bin/env sh
# The system packages the test suite needs beside the Python ones (`make test` and `make test-fast` call this
# first; so does deploy/containers.py before it builds images). Installs what is missing with apt-get when it
# can (root, Debian); otherwise stops at once, naming the packages and the command that installs them.
#
#   docker-compose         validates the compose files; runs the container demo against Podman's Docker API
#   podman, debootstrap    the container demo's engine and its images' Debian base
#   dataset-fashion-mnist  Fashion-MNIST as idx files (/usr/share/datasets/fashion-mnist), read by the loader
set -eu

missing=""
for pair in docker-compose:docker-compose podman:podman debootstrap:debootstrap; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing="$missing ${pair#*:}"
done
[ -d /usr/share/datasets/fashion-mnist ] || missing="$missing dataset-fashion-mnist"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "fedsmix needs these system packages for its tests:$missing" >&2
  echo "install them as root, then run the command again:  apt-get install -y$missing" >&2
  exit 1
fi
echo "installing system packages:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086 # one word per package
apt-get install -y -qq $missing >/dev/null
