#!/usr/bin/env bash
# Downloads CIFAR-10's binary version, checks its MD5 and extracts it, so that
# train_cifar10 finds data/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin.
# Without network access: copy the archive into the data folder by hand and run
# this again; it then only verifies and extracts.
set -euo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

readonly URL=https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz
readonly ARCHIVE_NAME=cifar-10-binary.tar.gz
readonly MD5=c32a1d4ab5d03f1284b67883e8d87530
readonly BATCHES=cifar-10-batches-bin
readonly FILES=(data_batch_1.bin data_batch_2.bin data_batch_3.bin
                data_batch_4.bin data_batch_5.bin test_batch.bin)
# Each file holds 10,000 records of 1 label byte + 3072 pixel bytes.
readonly FILE_BYTES=30730000

usage() {
  cat <<EOF
Usage: scripts/get_cifar10.sh [--dir DIR]

Downloads CIFAR-10 (binary version, 162 MB) from
  $URL
into DIR (default: data/ under the repository root), checks its MD5
($MD5) and extracts it to DIR/$BATCHES.
Does nothing when the six .bin files are already there.

Options:
  --dir DIR   where the archive and $BATCHES/ go
  -h, --help  this help

Without network access, download $ARCHIVE_NAME elsewhere, copy it into DIR
and run this script again: it then only verifies and extracts.
EOF
}

dir="$LAMP_ROOT/data"
while [ "$#" -gt 0 ]; do
  case "$1" in
    -h | --help)
      usage
      exit 0
      ;;
    --dir)
      if [ "$#" -lt 2 ] || [ -z "$2" ]; then
        lamp_die "--dir needs a directory (see --help)"
      fi
      dir="$2"
      shift 2
      ;;
    --dir=*)
      dir="${1#--dir=}"
      [ -n "$dir" ] || lamp_die "--dir needs a directory (see --help)"
      shift
      ;;
    *)
      printf 'error: unknown argument: %s\n\n' "$1" >&2
      usage >&2
      exit 2
      ;;
  esac
done

mkdir -p "$dir" || lamp_die "cannot create the directory $dir"
dir="$(cd "$dir" && pwd)"
archive="$dir/$ARCHIVE_NAME"
batches="$dir/$BATCHES"

# Temporary paths removed on exit, whatever the outcome (Ctrl-C included).
cleanup=()
remove_temporaries() {
  if [ "${#cleanup[@]}" -gt 0 ]; then
    rm -rf -- "${cleanup[@]}"
  fi
}
trap remove_temporaries EXIT

# Succeeds when DIR holds the six .bin files at their official size.
have_batches() {
  local file size
  for file in "${FILES[@]}"; do
    [ -f "$1/$file" ] || return 1
    size="$(wc -c <"$1/$file")"
    [ "$size" -eq "$FILE_BYTES" ] || return 1
  done
}

manual_steps() {
  cat >&2 <<EOF
To get it by hand: on a machine with internet access (a browser will do),
download
  $URL
copy $ARCHIVE_NAME into
  $dir/
and run this script again: it then verifies the MD5 and extracts, without
downloading.
EOF
}

report() {
  local data_arg="$batches"
  if [ "$dir" = "$LAMP_ROOT/data" ]; then
    data_arg="data/$BATCHES"
  fi
  lamp_log "CIFAR-10 is in $batches"
  printf 'Train (from %s, after scripts/quickstart.sh has built it):\n' "$LAMP_ROOT"
  printf '  build/release/examples/train_cifar10 --data %s\n' "$data_arg"
}

download() {
  local part="$archive.part"
  cleanup+=("$part")
  rm -f -- "$part"
  local tool status=0
  if command -v curl >/dev/null 2>&1; then
    tool=curl
  elif command -v wget >/dev/null 2>&1; then
    tool=wget
  else
    printf 'error: neither curl nor wget is installed, so %s cannot be downloaded.\n' "$ARCHIVE_NAME" >&2
    printf 'Install one (apt-get install curl) and run this script again.\n' >&2
    manual_steps
    exit 1
  fi
  lamp_log "Downloading $URL (162 MB) with $tool to $archive"
  if [ "$tool" = curl ]; then
    local progress=(-sS)
    if [ -t 2 ]; then
      progress=(--progress-bar)
    fi
    curl -fL "${progress[@]}" --connect-timeout 20 --retry 2 --retry-delay 2 \
      -o "$part" "$URL" || status=$?
  else
    local progress=(-nv)
    if [ -t 2 ]; then
      progress=()
    fi
    wget "${progress[@]}" --timeout=20 --tries=3 -O "$part" "$URL" || status=$?
  fi
  if [ "$status" -ne 0 ]; then
    printf 'error: the download of %s failed (%s exit status %s, see its message above):\n' "$URL" "$tool" "$status" >&2
    printf 'no network access, or the server did not deliver the file.\n' >&2
    manual_steps
    exit 1
  fi
  mv -f -- "$part" "$archive"
}

verify() {
  command -v md5sum >/dev/null 2>&1 || lamp_die "md5sum not found (it is in Debian's coreutils); it is needed to check $archive"
  lamp_log "Checking the MD5 of $archive"
  local sum
  sum="$(md5sum -- "$archive" | cut -d' ' -f1)"
  if [ "$sum" != "$MD5" ]; then
    rm -f -- "$archive"
    printf 'error: %s has MD5 %s, expected %s.\n' "$archive" "$sum" "$MD5" >&2
    printf 'It is corrupt, truncated, or not the binary version of CIFAR-10\n' >&2
    printf '(cifar-10-python.tar.gz and the MATLAB version are other formats), and has\n' >&2
    printf 'been deleted. Run this script again to download it anew.\n' >&2
    manual_steps
    exit 1
  fi
}

extract() {
  lamp_log "Extracting $archive"
  local staging
  staging="$(mktemp -d "$dir/.cifar10-extract.XXXXXX")"
  cleanup+=("$staging")
  tar -xzf "$archive" -C "$staging" ||
    lamp_die "cannot extract $archive (disk full?); delete it and run this script again"
  have_batches "$staging/$BATCHES" ||
    lamp_die "$archive does not hold $BATCHES/{${FILES[*]}} at $FILE_BYTES bytes each"
  mkdir -p "$batches"
  local file
  for file in "$staging/$BATCHES"/*; do
    mv -f -- "$file" "$batches/"
  done
}

if have_batches "$batches"; then
  lamp_log "CIFAR-10 is already there; nothing to download"
  report
  exit 0
fi
for file in "${FILES[@]}"; do
  if [ -e "$batches/$file" ]; then
    lamp_log "$batches is incomplete or damaged; extracting it again"
    break
  fi
done

if [ -f "$archive" ]; then
  lamp_log "Found $archive; not downloading"
else
  download
fi
verify
extract
lamp_log "Done; $archive can be deleted"
report
