#!/usr/bin/env bash
# CI step (`make colcon-check`, part of `make test`): build robotserve_ros with colcon, as a ROS 2
# workspace would, against the project venv's ROS 2 Kilted wheels (no /opt/ros here), then start
# a node from the install space and stop it. colcon comes from PyPI, pinned, into a venv of its
# own; the workspace lives outside the checkout (a venv inside the source tree would put numpy's
# include directory "in the source directory", which CMake refuses for the installed targets).
#   .ci/colcon_check.sh PROJECT_VENV     (COLCON_WS=... to choose the workspace folder)
set -euo pipefail
VENV=$(cd "${1:?usage: colcon_check.sh PROJECT_VENV}" && pwd)
SRC=$(cd "$(dirname "$0")/.." && pwd)
WS=${COLCON_WS:-${TMPDIR:-/tmp}/robotserve-colcon-$(printf %s "$SRC" | md5sum | cut -c1-8)}
COLCON="colcon-core==0.21.3 colcon-cmake==0.2.30 colcon-ros==0.5.0 colcon-python-setup-py==0.2.9 colcon-library-path==0.2.1"
t0=$(date +%s)
mkdir -p "$WS"
if [ "$(cat "$WS/colcon.pins" 2>/dev/null)" != "$COLCON" ]; then
  rm -rf "$WS/venv"
  "${PYTHON:-python3}" -m venv "$WS/venv"
  "$WS/venv/bin/pip" install --quiet $COLCON
  echo "$COLCON" > "$WS/colcon.pins"
fi
# The package as a workspace holds it (src/robotserve_ros): the checkout's sources only, i.e. what git
# tracks plus new files it does not ignore (never .venv, .venv-vllm, build output or reports/live/logs:
# copying .venv-vllm once put 3.4 GB in every workspace and filled a CI disk). tar keeps the files'
# times, so build/ of the last run rebuilds only what changed.
rm -rf "$WS/src" "$WS/install" "$WS/log"
mkdir -p "$WS/src/robotserve_ros"
if git -C "$SRC" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  (cd "$SRC" && git ls-files -z --cached --others --exclude-standard | grep -zv '_pb2' \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf -) | tar -C "$WS/src/robotserve_ros" -xf -
else  # a source tarball: leave out what the Makefile and the tests make
  tar -C "$SRC" --exclude=./.git --exclude='./.venv*' --exclude=./build --exclude=./install --exclude=./log \
    --exclude=./out --exclude=./logs --exclude=./data --exclude=./reports/live/logs \
    --exclude=__pycache__ --exclude=.pytest_cache --exclude=.hypothesis --exclude='*_pb2*.py' -cf - . \
    | tar -C "$WS/src/robotserve_ros" -xf -
fi
copied=$(du -sm "$WS/src" | cut -f1)
[ "$copied" -le 200 ] || { echo "colcon-check: the source copy is $copied MB (a venv or build output was copied?)"; exit 1; }
(
  export AMENT_PREFIX_PATH="$VENV" CMAKE_PREFIX_PATH="$VENV"
  cd "$WS"
  venv/bin/colcon --log-base log build --paths src/robotserve_ros --build-base build --install-base install \
    --cmake-args -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF > build.log 2>&1 \
    || { tail -40 build.log; echo "colcon-check: colcon build failed (whole output: $WS/build.log)"; exit 1; }
  grep -A3 "robotserve_ros:" build.log || true  # CMake's own messages (grpc_tools missing)
)
t1=$(date +%s)
# Run from the install space: its setup script, the venv's Python for the launchers' `python3`.
set +u
. "$WS/install/setup.sh"
set -u
export PATH="$VENV/bin:$PATH" ROS_LOG_DIR="$WS/roslog" HOME="${HOME:-$WS}"
SHARE="$WS/install/robotserve_ros/share/robotserve_ros"
where=$(cd "$WS" && python3 -c "import robotserve_ros, robotserve_ros.msg, robotserve_ros.core; print(robotserve_ros.__file__)")
case "$where" in
  "$WS/install/"*) ;;
  *) echo "colcon-check: robotserve_ros imported from $where, not from the install space"; exit 1 ;;
esac
test ! -e "$WS/install/robotserve_ros/lib/robotserve_ros/gpu_reports.sh" \
  || { echo "colcon-check: scripts/gpu_reports.sh was installed as a ROS executable"; exit 1; }
# DDS on loopback only, on a ROS domain nobody on this machine uses now.
export FASTDDS_DEFAULT_PROFILES_FILE="$SHARE/config/fastdds_loopback.xml" ROS_AUTOMATIC_DISCOVERY_RANGE=SUBNET
export ROS_DOMAIN_ID=$(cd "$WS" && python3 -c "from robotserve_ros.live.processes import pick_free_domain; print(pick_free_domain())")
log="$WS/inference_server.log"
"$WS/install/robotserve_ros/lib/robotserve_ros/inference_server" --ros-args --params-file "$SHARE/config/fleet.yaml" \
  > "$log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do
  grep -q "serving on" "$log" && break
  kill -0 "$pid" 2> /dev/null || break
  sleep 0.25
done
if ! grep -q "serving on" "$log"; then
  kill -INT "$pid" 2> /dev/null || true
  echo "colcon-check: the installed inference_server did not start:"; tail -5 "$log"; exit 1
fi
kill -INT "$pid"
rc=0; wait "$pid" || rc=$?
[ "$rc" = 0 ] || { echo "colcon-check: the installed inference_server exited $rc at SIGINT:"; tail -5 "$log"; exit 1; }
echo "colcon-check: colcon build in $((t1 - t0)) s ($WS); installed inference_server started and stopped cleanly"
