// Command controlplane is a multi-call binary holding a whole local Kubernetes cluster, built
// from the official modules only: kube-apiserver, kube-controller-manager and kube-scheduler,
// and the real nodes' kubelet and kube-proxy (k8s.io/kubernetes), etcd
// (go.etcd.io/etcd/server/v3), kwok (sigs.k8s.io/kwok) and kubectl (k8s.io/kubectl). One binary
// links once and shares every common package, which saves most of the link time and disk that
// separate binaries would cost.
//
// It dispatches on the base name it was started as (up.sh makes symlinks named after each
// component), or, when started as "controlplane", on its first argument:
//
//	kube-apiserver --etcd-servers=...          (through a symlink)
//	controlplane kube-apiserver --etcd-servers=...
//
// helm is not in here: helm v3 keeps its command in package main (helm.sh/helm/v3/cmd/helm),
// which cannot be imported, so it is built from that package as a second binary of this module.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	_ "time/tzdata" // CronJob time zones, as the upstream kube-apiserver and controller manager do

	"github.com/spf13/pflag"
	etcdmain "go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream mains do
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream mains do
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream mains do
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	kubeproxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	kwoknodefast "sigs.k8s.io/kwok/kustomize/stage/node/fast"
	kwokheartbeat "sigs.k8s.io/kwok/kustomize/stage/node/heartbeat-with-lease"
	kwokpodfast "sigs.k8s.io/kwok/kustomize/stage/pod/fast"
	kwokconfig "sigs.k8s.io/kwok/pkg/config"
	kwokcmd "sigs.k8s.io/kwok/pkg/kwok/cmd"
	kwoklog "sigs.k8s.io/kwok/pkg/log"
	kwoksignals "sigs.k8s.io/kwok/pkg/utils/signals"

	_ "k8s.io/client-go/plugin/pkg/client/auth" // kubectl's auth plugins, as upstream kubectl does
)

// Each entry mirrors the main() of the upstream command of the same name.
var commands = map[string]func() int{
	"kube-apiserver": func() int { return cli.Run(apiserver.NewAPIServerCommand()) },
	"kube-controller-manager": func() int {
		return cli.Run(controllermanager.NewControllerManagerCommand())
	},
	"kube-scheduler": func() int { return cli.Run(scheduler.NewSchedulerCommand()) },
	"kubelet":        runKubelet,
	"kube-proxy":     func() int { return cli.Run(kubeproxy.NewProxyCommand()) },
	"kubectl":        runKubectl,
	"kwok":           runKwok,
	"kwok-stages":    printKwokStages,
	"etcd": func() int {
		etcdmain.Main(os.Args) // returns only when etcd has stopped
		return 0
	},
}

// runKubectl is k8s.io/kubernetes/cmd/kubectl/kubectl.go.
func runKubectl() int {
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err) // prints and exits
	}
	return 0
}

// runKubelet is k8s.io/kubernetes/cmd/kubelet/kubelet.go.
func runKubelet() int {
	return cli.Run(kubelet.NewKubeletCommand(context.Background()))
}

// runKwok is sigs.k8s.io/kwok/cmd/kwok/main.go.
func runKwok() int {
	// cobra merges the global pflag.CommandLine into every root command, and in this binary it
	// already holds component-base's --version (a string flag, registered in an init), which
	// makes cobra refuse to run kwok ("version" flag declared as non-bool). A standalone kwok
	// links no such package; give it the empty global flag set it would have.
	pflag.CommandLine = pflag.NewFlagSet(os.Args[0], pflag.ExitOnError)
	flagset := pflag.NewFlagSet("global", pflag.ContinueOnError)
	flagset.ParseErrorsAllowlist.UnknownFlags = true
	flagset.Usage = func() {}
	ctx := kwoksignals.SetupSignalContext()
	ctx, logger := kwoklog.InitFlags(ctx, flagset)
	ctx, err := kwokconfig.InitFlags(ctx, flagset)
	if err != nil {
		_, _ = os.Stderr.Write([]byte(flagset.FlagUsages()))
		logger.Error("Init config flags", "err", err)
		return 1
	}
	command := kwokcmd.NewCommand(ctx)
	command.PersistentFlags().AddFlagSet(flagset)
	if err := command.ExecuteContext(ctx); err != nil {
		logger.Error("Execute exit", "err", err)
		return 1
	}
	return 0
}

// printKwokStages prints the Stage objects kwok needs to drive fake nodes and pods. kwok v0.8
// loads no stage of its own (it fails with "no stages found"); kwokctl writes these embedded
// defaults into the config it gives kwok, and so does up.sh through this command: node-initialize
// (a new node becomes Ready), node-heartbeat-with-lease (its conditions are refreshed; liveness is
// the node Lease, which kwok renews when --node-lease-duration-seconds is set), pod-ready (a
// scheduled pod becomes Running and Ready), pod-complete (a pod of a Job-like owner succeeds) and
// pod-delete (a pod being deleted is removed, as a kubelet would). Two differ from the defaults,
// for pods that carry finalizers (Kueue's on the pods it manages): pod-delete waits until they
// are gone, and pod-stop ends the pod first, as a kubelet stops the containers of a pod being
// deleted and reports it Failed while the finalizers keep the object. With the default
// pod-delete alone such a pod stayed Running forever, and Kueue counted it as live.
func printKwokStages() int {
	for i, stage := range []string{
		kwoknodefast.DefaultNodeInit,
		kwokheartbeat.DefaultNodeHeartbeatWithLease,
		kwokpodfast.DefaultPodReady,
		kwokpodfast.DefaultPodComplete,
		podDeleteWithoutFinalizers,
		podStop,
	} {
		if i > 0 {
			fmt.Println("---")
		}
		fmt.Print(strings.TrimSpace(stage) + "\n")
	}
	return 0
}

func main() {
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".exe")
	args := os.Args[1:]
	if _, ok := commands[name]; !ok && len(args) > 0 {
		// Started as "controlplane <command> ...": shift the command into argv[0].
		name, args = args[0], args[1:]
	}
	run, ok := commands[name]
	if !ok {
		names := make([]string, 0, len(commands))
		for n := range commands {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: controlplane {%s} [args...]\n", strings.Join(names, "|"))
		os.Exit(2)
	}
	// The upstream commands read os.Args themselves (cobra, kubectl, etcd), so rewrite it as if
	// each had been started on its own.
	os.Args = append([]string{name}, args...)
	os.Exit(run())
}

// podDeleteWithoutFinalizers is kwok's default pod-delete, for pods with no finalizer left.
const podDeleteWithoutFinalizers = `
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  next:
    delete: true
`

// podStop ends a pod being deleted that finalizers keep: its containers terminated by SIGTERM
// (exit code 143) and the pod Failed.
const podStop = `
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-stop
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'Exists'
    - key: '.status.phase'
      operator: 'In'
      values:
      - 'Pending'
      - 'Running'
  next:
    statusTemplate: |
      {{ $now := Now }}
      containerStatuses:
      {{ range $index, $item := .spec.containers }}
      - image: {{ $item.image | Quote }}
        name: {{ $item.name | Quote }}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: 143
            finishedAt: {{ $now | Quote }}
            reason: Error
            startedAt: {{ $now | Quote }}
      {{ end }}
      phase: Failed
`
