#!/usr/bin/env bash
# A throwaway PostgreSQL server on loopback for tests and benchmarks.
#
#   bash scripts/postgres.sh start DIR [PORT]   installs PostgreSQL from Debian's
#       packages when missing, creates a cluster in DIR (owned by the postgres
#       user), starts it on 127.0.0.1:PORT (default 55432) with password
#       authentication, creates the role `cortex` (password `cortex`, allowed
#       to create databases) and the database `cortex`, and prints its URL.
#       TLS is on, with a self-signed certificate in DIR/tls/server.crt
#       (DIR/tls/other.crt signed nothing here); the role `cortex_tls`
#       (password `cortex`) may connect over TLS only.
#   bash scripts/postgres.sh stop DIR           stops it (the cluster stays in DIR).
#   bash scripts/postgres.sh restart DIR        restarts it (tests of reconnection).
set -euo pipefail

action=${1:?usage: postgres.sh start|stop|restart DIR [PORT]}
dir=${2:?usage: postgres.sh start|stop|restart DIR [PORT]}
port=${3:-55432}

as_postgres() {
    if [ "$(id -u)" = 0 ]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

bin_dir() {
    local pg_config
    pg_config=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    if [ -z "$pg_config" ]; then
        echo "==> installing PostgreSQL (Debian packages)" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >&2
        apt-get install -y -qq --no-install-recommends postgresql postgresql-client >&2
        pg_config=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
    fi
    echo "$pg_config"
}

case "$action" in
start)
    bin=$(bin_dir)
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --home-dir "$dir" postgres
        chown postgres "$dir"
    fi
    if [ ! -f "$dir/data/PG_VERSION" ]; then
        echo cortex > "$dir/pwfile"
        [ "$(id -u)" = 0 ] && chown postgres "$dir/pwfile"
        as_postgres "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust \
            --auth-host=scram-sha-256 --pwfile="$dir/pwfile" -E UTF8 >"$dir/initdb.log"
        rm -f "$dir/pwfile"
        cat >>"$dir/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 200
fsync = on
synchronous_commit = on
shared_buffers = 256MB
EOF
    fi
    if [ ! -f "$dir/tls/server.crt" ]; then
        # TLS with a self-signed certificate (for 127.0.0.1 and localhost),
        # and one that signed nothing here (for tests of verification). The
        # role cortex_tls may connect over TLS only.
        command -v openssl >/dev/null 2>&1 || {
            apt-get update -qq >&2
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >&2
        }
        mkdir -p "$dir/tls"
        for name in server other; do
            openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=localhost" \
                -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
                -keyout "$dir/tls/$name.key" -out "$dir/tls/$name.crt" 2>/dev/null
        done
        chmod 600 "$dir/tls/server.key"
        [ "$(id -u)" = 0 ] && chown postgres "$dir/tls/server.key"
        cat >>"$dir/data/postgresql.conf" <<EOF
ssl = on
ssl_cert_file = '$dir/tls/server.crt'
ssl_key_file = '$dir/tls/server.key'
EOF
        hba="$dir/data/pg_hba.conf"
        { echo "hostnossl all cortex_tls all reject"; cat "$hba"; } >"$hba.new"
        mv "$hba.new" "$hba"
        [ "$(id -u)" = 0 ] && chown postgres "$hba"
    fi
    as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >&2
    as_postgres "$bin/psql" -h "$dir" -p "$port" -U postgres -d postgres -qtA -v ON_ERROR_STOP=1 >/dev/null <<'EOF'
SELECT 'CREATE ROLE cortex LOGIN CREATEDB PASSWORD ''cortex'''
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cortex') \gexec
SELECT 'CREATE ROLE cortex_tls LOGIN CREATEDB PASSWORD ''cortex'''
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cortex_tls') \gexec
SELECT 'CREATE DATABASE cortex OWNER cortex'
WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = 'cortex') \gexec
EOF
    echo "postgres://cortex:cortex@127.0.0.1:$port/cortex"
    ;;
stop)
    bin=$(bin_dir)
    as_postgres "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || true
    ;;
restart)
    bin=$(bin_dir)
    as_postgres "$bin/pg_ctl" -D "$dir/data" -m fast -w -t 60 -l "$dir/server.log" restart >&2
    ;;
*)
    echo "usage: postgres.sh start|stop|restart DIR [PORT]" >&2
    exit 2
    ;;
esac
