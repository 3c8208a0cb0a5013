#!/bin/sh
# The agent image's entrypoint: give bcc kernel headers at /lib/modules/$(uname -r)/{build,source},
# then run `tailsight "$@"`. The node's own headers when it has them (the DaemonSet mounts the
# node's /lib/modules and /usr/src under /host), else the image's generic Debian ones: bcc only
# needs *some* headers to compile, every struct offset comes from the node's BTF.
# TAILSIGHT_HOST_ROOT, TAILSIGHT_MODULES_DIR, TAILSIGHT_GENERIC_HEADERS, TAILSIGHT_KERNEL_RELEASE
# and TAILSIGHT_EXEC (what is run) are for tests.
set -eu
release=${TAILSIGHT_KERNEL_RELEASE:-$(uname -r)}
host=${TAILSIGHT_HOST_ROOT:-/host}
modules=${TAILSIGHT_MODULES_DIR:-/lib/modules}
generic=${TAILSIGHT_GENERIC_HEADERS:-/usr/src}

# The node's /lib/modules/$release/$1 as seen here (its symlinks point at the node's paths).
node_headers() {
    link="$host/lib/modules/$release/$1"
    if target=$(readlink "$link"); then
        case "$target" in
            /*) echo "$host$target" ;;
            *) echo "$host/lib/modules/$release/$target" ;;
        esac
    elif [ -d "$link" ]; then
        echo "$link"
    fi
}

build=$(node_headers build)
source=$(node_headers source)
if [ -n "$build" ] && [ -d "$build/include" ]; then
    if [ -z "$source" ] || [ ! -d "$source" ]; then source=$build; fi
    origin="the node's"
else
    build=$(find "$generic" -maxdepth 1 -name 'linux-headers-*' ! -name '*-common' | sort -V | tail -1)
    source=$(find "$generic" -maxdepth 1 -name 'linux-headers-*-common' | sort -V | tail -1)
    if [ -z "$build" ]; then
        echo "tailsight: no kernel headers: none on the node (/lib/modules/$release/build), none in the image" >&2
        exit 1
    fi
    if [ -z "$source" ]; then source=$build; fi
    origin="the image's generic"
fi
mkdir -p "$modules/$release"
ln -sfn "$build" "$modules/$release/build"
ln -sfn "$source" "$modules/$release/source"
echo "tailsight: kernel headers for bcc: $origin ($build)" >&2
exec ${TAILSIGHT_EXEC:-tailsight} "$@"
