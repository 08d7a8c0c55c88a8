# Sourced by scripts/setup.d/*.sh: apt_install PKG... installs the Debian packages that are missing
# (one `apt-get update` per setup run, only when something is missing). Needs root and apt-get;
# elsewhere it says what to install and returns 1.
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" != "0" ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "setup: please install the Debian packages: ${missing[*]}" >&2
    return 1
  fi
  echo "setup: installing ${missing[*]} (apt)"
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "${SAPGRID_APT_UPDATED:-}" ]; then
    apt-get update -qq && export SAPGRID_APT_UPDATED=1
  fi
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
