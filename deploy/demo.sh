#!/usr/bin/env bash
# The demo: a simulated HA control plane doing the KEP's rolling upgrade, on a real
# local Kafka broker and a real SQL database, once with the agreement-based trigger
# and once with the old discovery-hash trigger for comparison.
set -euo pipefail
cd "$(dirname "$0")/.."

work=${SVLEDGER_DEMO_DIR:-.svledger/demo}
mkdir -p "$work"
rm -f "$work"/*.db

broker_pid=
stop_broker() {
  if [ -n "$broker_pid" ]; then
    kill -TERM "$broker_pid" 2>/dev/null || true
    wait "$broker_pid" 2>/dev/null || true
  fi
}
trap stop_broker EXIT

if [ -z "${SVLEDGER_KAFKA_BOOTSTRAP:-}" ]; then
  echo "starting a local Kafka broker (deploy/kafka) ..." >&2
  coproc BROKER { exec .venv/bin/python deploy/kafka/broker.py run 2>"$work/broker.log"; }
  broker_pid=$BROKER_PID
  read -r SVLEDGER_KAFKA_BOOTSTRAP <&"${BROKER[0]}"
  export SVLEDGER_KAFKA_BOOTSTRAP
  echo "broker ready at $SVLEDGER_KAFKA_BOOTSTRAP" >&2
fi

for trigger in agreement discovery-hash; do
  db="sqlite:///$work/$trigger.db"
  echo
  echo "=== svledger simulate examples/kep-walkthrough.yaml --trigger $trigger ==="
  log="$work/simulate-$trigger.log"
  if ! .venv/bin/svledger simulate examples/kep-walkthrough.yaml \
      --db "$db" --topic "svledger.demo.$trigger.$$" --trigger "$trigger" 2>"$log"; then
    echo "simulation failed; the last lines of its log ($log):" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
done

echo
echo "Logs (JSON lines) are in $work/simulate-*.log; the agreement run's views are in"
echo "$work/agreement.db; try:"
echo "  .venv/bin/svledger explain apps.deployments --db sqlite:///$work/agreement.db"
