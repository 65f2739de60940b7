#!/usr/bin/env bash
# Install a pinned OpenCode for the tests and benchmarks, and print the variable that points them at it.
#   eval "$(bash tools/opencode_setup.sh)"     # exports LOOPD_ES_TEST_OPENCODE=<dir>
# <dir>/bin/opencode is the platform binary (npm with scripts off: opencode-ai's postinstall only links it);
# <dir>/plugin/node_modules holds @opencode-ai/plugin, which the tests copy into every OpenCode config
# directory so that OpenCode never runs npm itself (the tests run it with the registry pointed at a dead port).
set -euo pipefail
version=${LOOPD_ES_OPENCODE_VERSION:-1.18.33}
dir=${LOOPD_ES_OPENCODE_DIR:-$HOME/.cache/loopd-es/opencode-$version}
if [ ! -x "$dir/bin/opencode" ] || [ ! -d "$dir/plugin/node_modules/@opencode-ai/plugin" ]; then
    mkdir -p "$dir/npm" "$dir/plugin" "$dir/bin"
    npm install --prefix "$dir/npm" --no-save --no-audit --no-fund --ignore-scripts --loglevel=error \
        "opencode-ai@$version" >&2
    case "$(uname -m)" in
        x86_64) platform=linux-x64 ;;
        aarch64|arm64) platform=linux-arm64 ;;
        *) echo "no OpenCode build for $(uname -m)" >&2; exit 2 ;;
    esac
    ln -sf "$dir/npm/node_modules/opencode-$platform/bin/opencode" "$dir/bin/opencode"
    printf '{"dependencies":{"@opencode-ai/plugin":"%s"}}\n' "$version" > "$dir/plugin/package.json"
    npm install --prefix "$dir/plugin" --no-audit --no-fund --loglevel=error >&2
fi
"$dir/bin/opencode" --version >/dev/null
echo "export LOOPD_ES_TEST_OPENCODE=$dir"
