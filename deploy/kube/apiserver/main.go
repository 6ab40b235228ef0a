// Command kube-apiserver is the upstream kube-apiserver with its identity-lease timings
// made settable from the environment.
//
// kube-apiserver has no flags for how long its identity lease
// (kube-system/apiserver-<hash>, label apiserver.kubernetes.io/identity=kube-apiserver)
// lives, how often it is renewed, or how often expired leases of other apiservers are
// garbage-collected: upstream hard-codes 3600 s, 10 s and 3600 s in package variables of
// k8s.io/kubernetes/pkg/controlplane/apiserver, which its own integration tests overwrite.
// This main does the same from three optional environment variables, then runs the
// command exactly as cmd/kube-apiserver's main does:
//
//	SVLEDGER_IDENTITY_LEASE_DURATION_SECONDS  lease duration, whole seconds (e.g. 10)
//	SVLEDGER_IDENTITY_LEASE_RENEW_INTERVAL    renew interval, a Go duration (e.g. 1s)
//	SVLEDGER_IDENTITY_LEASE_GC_PERIOD         expired-lease GC period, a Go duration (e.g. 5s)
//
// Unset or empty variables keep the upstream values. An unparsable or non-positive value
// exits with code 2 before the server starts.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
	_ "time/tzdata" // for timeZone support in CronJob

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	controlplaneapiserver "k8s.io/kubernetes/pkg/controlplane/apiserver"
)

const (
	envLeaseDurationSeconds = "SVLEDGER_IDENTITY_LEASE_DURATION_SECONDS"
	envLeaseRenewInterval   = "SVLEDGER_IDENTITY_LEASE_RENEW_INTERVAL"
	envLeaseGCPeriod        = "SVLEDGER_IDENTITY_LEASE_GC_PERIOD"
)

func main() {
	if err := applyIdentityLeaseSettings(); err != nil {
		fmt.Fprintf(os.Stderr, "kube-apiserver: %v\n", err)
		os.Exit(2)
	}
	command := app.NewAPIServerCommand()
	code := cli.Run(command)
	os.Exit(code)
}

func applyIdentityLeaseSettings() error {
	if value := os.Getenv(envLeaseDurationSeconds); value != "" {
		seconds, err := strconv.Atoi(value)
		if err != nil || seconds <= 0 {
			return fmt.Errorf("%s=%q: want a positive whole number of seconds", envLeaseDurationSeconds, value)
		}
		controlplaneapiserver.IdentityLeaseDurationSeconds = seconds
	}
	if err := setDuration(envLeaseRenewInterval, &controlplaneapiserver.IdentityLeaseRenewIntervalPeriod); err != nil {
		return err
	}
	return setDuration(envLeaseGCPeriod, &controlplaneapiserver.IdentityLeaseGCPeriod)
}

func setDuration(name string, target *time.Duration) error {
	value := os.Getenv(name)
	if value == "" {
		return nil
	}
	duration, err := time.ParseDuration(value)
	if err != nil || duration <= 0 {
		return fmt.Errorf("%s=%q: want a positive Go duration such as 1s or 500ms", name, value)
	}
	*target = duration
	return nil
}
