# Shared shell helpers for the project's scripts. Source it; do not run it.
# Every service started here records its PID under .local/ and is stopped by PID.

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
state="$root/.local"
mkdir -p "$state"

free_port() {
  "$venv/bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

wait_for_port() { # port, seconds, name
  local port=$1 secs=$2 name=$3 i
  for ((i = 0; i < secs * 10; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "$name did not start listening on port $port within ${secs}s" >&2
  return 1
}

# Environment for the AWS SDK clients: every service through moto.
aws_env() { # moto port
  export AWS_ENDPOINT_URL="http://127.0.0.1:$1"
  export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1
  export AWS_EC2_METADATA_DISABLED=true
  unset AWS_PROFILE AWS_SESSION_TOKEN
}

start_moto() { # port, log file; sets moto_pid
  local port=$1 log=$2
  "$venv/bin/python" "$root/infra/local/moto_server.py" --port "$port" >"$log" 2>&1 &
  moto_pid=$!
  echo "$moto_pid" >"$state/moto.pid"
  wait_for_port "$port" 30 "moto" || { cat "$log" >&2; return 1; }
}

start_fake_providers() { # port, log file; sets fake_pid
  local port=$1 log=$2
  "$venv/bin/python" "$root/infra/local/fake_providers.py" --port "$port" >"$log" 2>&1 &
  fake_pid=$!
  echo "$fake_pid" >"$state/fake.pid"
  wait_for_port "$port" 30 "fake provider APIs" || { cat "$log" >&2; return 1; }
}

stop_pid() { # pid
  local pid=$1 i
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  # The process group first (cargo lambda watch runs children), then the PID.
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}

stop_tree() { # pid: a background job that is not a process group (its children first)
  local pid=$1 child
  [ -n "$pid" ] || return 0
  for child in $(pgrep -P "$pid" 2>/dev/null); do stop_tree "$child"; done
  kill -TERM "$pid" 2>/dev/null || true
}

# Local-only endpoint configuration and development secrets.
local_env() {
  set -a
  # shellcheck disable=SC1091
  . "$root/infra/local/dev.env"
  set +a
  HOOKLEDGER_ENDPOINTS="$(cat "$root/infra/local/endpoints.json")"
  export HOOKLEDGER_ENDPOINTS
  # Where secrets handed over at a handshake (Asana) are kept, in the emulator's SSM.
  export HOOKLEDGER_HANDSHAKE_PATH=/hookledger/local/handshake
}

# Starts `cargo lambda watch` serving the workspace's functions; sets watch_pid.
start_watch() { # port, log file
  local port=$1 log=$2
  setsid "$venv/bin/cargo-lambda" lambda watch --invoke-address 127.0.0.1 --invoke-port "$port" --ignore-changes \
    >"$log" 2>&1 &
  watch_pid=$!
  echo "$watch_pid" >"$state/watch.pid"
  wait_for_port "$port" 120 "cargo lambda watch" || { cat "$log" >&2; return 1; }
}
