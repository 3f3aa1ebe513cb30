// The pod runner: a test kubelet that runs pods for real. kwok fakes every pod it is given; the
// pod runner instead plays the kubelet of the nodes labelled murmur.dev/pod-runner=true (nodes
// kwok does not manage), and for each pod scheduled there:
//
//   - gives it a network namespace with an address of the node's pod range, on a bridge in the
//     root namespace whose first address stands for "the host" (the operator runs there);
//   - writes the namespace's hosts file (ip netns exec mounts /etc/netns/NS/hosts over
//     /etc/hosts): the headless Service names of the pods of its namespace, and --host-alias
//     names (the operator's Service) for the host;
//   - mounts its Secret, ConfigMap, emptyDir and PersistentVolumeClaim volumes where the pod spec
//     says (in a mount namespace of its own), sets its hostname (a UTS namespace), its env exactly
//     as the spec gives it (plus PATH and HOSTNAME, as a container runtime does) and its user and
//     group (runAsUser, runAsGroup), and runs its one container's command, with --entrypoint
//     standing for the image's entrypoint;
//   - reports phase, podIP, container state, readiness (its HTTP readiness probe, for real), exit
//     code and termination message (FallbackToLogsOnError honoured) through the API server;
//   - on deletion sends SIGTERM, waits the grace period, sends SIGKILL, reports the container
//     terminated and removes the pod (grace 0, with its UID as precondition), as a kubelet does;
//   - when its Node object is deleted, kills its pods at once (the machine is gone) and leaves
//     their removal to the pod garbage collector.
//
// It keeps the runner nodes alive as a kubelet does: Ready condition, addresses and their Lease
// in kube-node-lease, renewed every 10 s. Only as much kubelet as murmur's end-to-end tests need:
// one container per pod, no restarts (restartPolicy Never), no liveness probe, no image, no
// read-only root filesystem, no resource limits. Needs root (network and mount namespaces).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// The label that hands a node to the pod runner (and that kwok's annotation must not be on).
const runnerNodeLabel = "murmur.dev/pod-runner"

type runner struct {
	cs            kubernetes.Interface
	state         string // pod dirs, PVC dirs
	entrypoint    string // the image's entrypoint: the trainer binary of the build
	bridge        string
	hostIP        net.IP     // the bridge's address: the host, as pods see it
	podNet        *net.IPNet // every pod address is in here; one /24 per node
	clusterDomain string
	aliases       map[string]string // extra hosts entries: name -> address

	mu       sync.Mutex
	nodes    map[string]*runnerNode
	pods     map[types.UID]*runningPod
	subnets  map[int]string // /24 index -> node
	services listersv1.ServiceLister
	podList  listersv1.PodLister
}

type runnerNode struct {
	name   string
	subnet int          // the third octet of its pods' addresses
	used   map[int]bool // fourth octets taken
	stop   chan struct{}
}

type runningPod struct {
	pod      *corev1.Pod // as last seen
	dir      string
	netns    string
	veth     string
	ip       net.IP
	octet    int
	cmd      *exec.Cmd
	started  metav1.Time
	done     chan struct{}
	ready    bool
	deleting bool // SIGTERM sent
	lost     bool // its node is gone: nothing more is reported
	finished bool // its container exited and that was reported
}

func runPodRunner() int {
	fs := flag.NewFlagSet("pod-runner", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "admin kubeconfig")
	state := fs.String("state", "", "directory for the pods' files (required)")
	entrypoint := fs.String("entrypoint", "", "the program that stands for the image's entrypoint (required)")
	bridge := fs.String("bridge", "murmur-pods", "name of the bridge the pods attach to (made, and removed on exit)")
	cidr := fs.String("pod-cidr", "10.244.0.0/16", "pod addresses (a /16): .0.1 is the host, node n gets .n.0/24")
	clusterDomain := fs.String("cluster-domain", "cluster.local", "the cluster's DNS domain")
	var aliases stringList
	fs.Var(&aliases, "host-alias", "NAME=ADDRESS for every pod's hosts file; ADDRESS 'host' is the bridge's address (repeatable)")
	_ = fs.Parse(os.Args[1:])
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "pod-runner: "+format+"\n", args...)
		return 1
	}
	if *state == "" || *entrypoint == "" {
		return fail("--state and --entrypoint are required")
	}
	if os.Geteuid() != 0 {
		return fail("needs root (network and mount namespaces)")
	}
	_, podNet, err := net.ParseCIDR(*cidr)
	if err != nil || podNet.IP.To4() == nil {
		return fail("--pod-cidr %q: not an IPv4 range: %v", *cidr, err)
	}
	if ones, _ := podNet.Mask.Size(); ones != 16 {
		return fail("--pod-cidr %q: must be a /16", *cidr)
	}
	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fail("--kubeconfig %q: %v", *kubeconfig, err)
	}
	config.QPS, config.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(config)
	if err != nil {
		return fail("client: %v", err)
	}
	hostIP := addr(podNet, 0, 1)
	r := &runner{
		cs: cs, state: *state, entrypoint: *entrypoint, bridge: *bridge, hostIP: hostIP,
		podNet: podNet, clusterDomain: *clusterDomain, aliases: map[string]string{},
		nodes: map[string]*runnerNode{}, pods: map[types.UID]*runningPod{}, subnets: map[int]string{},
	}
	for _, a := range aliases {
		name, address, ok := strings.Cut(a, "=")
		if !ok || name == "" {
			return fail("--host-alias %q: expected NAME=ADDRESS", a)
		}
		if address == "host" {
			address = hostIP.String()
		}
		if net.ParseIP(address) == nil {
			return fail("--host-alias %q: %q is not an address", a, address)
		}
		r.aliases[name] = address
	}
	if err := os.MkdirAll(*state, 0o755); err != nil {
		return fail("--state: %v", err)
	}
	if err := r.makeBridge(); err != nil {
		return fail("bridge %s: %v", *bridge, err)
	}
	defer r.removeBridge()

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	all := informers.NewSharedInformerFactory(cs, 0)
	runnerNodes := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = runnerNodeLabel + "=true" }))
	r.services = all.Core().V1().Services().Lister()
	r.podList = all.Core().V1().Pods().Lister()
	_, _ = runnerNodes.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.nodeSeen(ctx, o.(*corev1.Node)) },
		UpdateFunc: func(_, o any) { r.nodeSeen(ctx, o.(*corev1.Node)) },
		DeleteFunc: func(o any) { r.nodeGone(nameOf(o)) },
	})
	_, _ = all.Core().V1().Services().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.locked(r.writeHostsFiles) },
		UpdateFunc: func(any, any) { r.locked(r.writeHostsFiles) },
		DeleteFunc: func(any) { r.locked(r.writeHostsFiles) },
	})
	runnerNodes.Start(ctx.Done())
	runnerNodes.WaitForCacheSync(ctx.Done())
	all.Start(ctx.Done())
	all.WaitForCacheSync(ctx.Done())
	// Pods after their nodes, so that a pod on a runner node is never taken for another's.
	_, _ = all.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { r.podSeen(ctx, o.(*corev1.Pod)) },
		UpdateFunc: func(_, o any) { r.podSeen(ctx, o.(*corev1.Pod)) },
		DeleteFunc: func(o any) { r.podGone(o) },
	})
	fmt.Fprintf(os.Stderr, "pod-runner: running pods of nodes labelled %s=true on bridge %s (%s, host %s)\n",
		runnerNodeLabel, *bridge, podNet, hostIP)
	<-ctx.Done()
	// Stopping: every container dies with the runner, as with a machine switched off; each one's
	// exit cleans up its namespace.
	var running []*runningPod
	r.locked(func() {
		for _, p := range r.pods {
			p.lost = true
			r.kill(p, syscall.SIGKILL)
			running = append(running, p)
		}
	})
	for _, p := range running {
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	}
	return 0
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func (r *runner) locked(f func()) { r.mu.Lock(); defer r.mu.Unlock(); f() }

func nameOf(o any) string {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	if m, ok := o.(metav1.Object); ok {
		return m.GetName()
	}
	return ""
}

// addr is the address 10.x.third.fourth of the /16.
func addr(n *net.IPNet, third, fourth int) net.IP {
	ip := n.IP.To4()
	return net.IPv4(ip[0], ip[1], byte(third), byte(fourth)).To4()
}

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func (r *runner) makeBridge() error {
	_ = ipCmd("link", "del", r.bridge) // a runner that died before removing it
	ones, _ := r.podNet.Mask.Size()
	for _, args := range [][]string{
		{"link", "add", r.bridge, "type", "bridge"},
		{"addr", "add", fmt.Sprintf("%s/%d", r.hostIP, ones), "dev", r.bridge},
		{"link", "set", r.bridge, "up"},
	} {
		if err := ipCmd(args...); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) removeBridge() { _ = ipCmd("link", "del", r.bridge) }

// --- nodes ---------------------------------------------------------------------------------

func (r *runner) nodeSeen(ctx context.Context, node *corev1.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, known := r.nodes[node.Name]; known {
		return
	}
	n := &runnerNode{name: node.Name, used: map[int]bool{}, stop: make(chan struct{})}
	// Its pod range: spec.podCIDR when it is a /24 of ours, else the first free /24.
	if _, c, err := net.ParseCIDR(node.Spec.PodCIDR); err == nil && r.podNet.Contains(c.IP) {
		n.subnet = int(c.IP.To4()[2])
	} else {
		for n.subnet = 1; r.subnets[n.subnet] != ""; n.subnet++ {
		}
	}
	if other := r.subnets[n.subnet]; other != "" || n.subnet < 1 || n.subnet > 254 {
		fmt.Fprintf(os.Stderr, "pod-runner: node %s: pod range .%d. taken by %s or out of range; not running its pods\n", node.Name, n.subnet, other)
		return
	}
	r.subnets[n.subnet] = node.Name
	r.nodes[node.Name] = n
	go r.heartbeat(ctx, node, n.stop)
}

func (r *runner) nodeGone(name string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[name]
	if !ok {
		return
	}
	close(n.stop)
	delete(r.nodes, name)
	delete(r.subnets, n.subnet)
	// The machine is gone with its node: its processes die with it, and nobody reports for them.
	for _, p := range r.pods {
		if p.pod.Spec.NodeName == name {
			p.lost = true
			r.kill(p, syscall.SIGKILL)
		}
	}
}

// heartbeat reports the node Ready once, then renews its Lease every 10 s until it is gone.
func (r *runner) heartbeat(ctx context.Context, node *corev1.Node, stop chan struct{}) {
	now := metav1.Now()
	status := map[string]any{
		"conditions": []map[string]any{{
			"type": "Ready", "status": "True", "reason": "KubeletReady",
			"message":           "murmur pod-runner is posting ready status",
			"lastHeartbeatTime": now, "lastTransitionTime": now,
		}},
		"addresses": []map[string]any{
			{"type": "InternalIP", "address": r.hostIP.String()},
			{"type": "Hostname", "address": node.Name},
		},
		"nodeInfo": map[string]any{"kubeletVersion": "v1.37.2-murmur-pod-runner", "operatingSystem": "linux", "architecture": "amd64"},
	}
	if len(node.Status.Allocatable) == 0 {
		size := map[string]string{"cpu": "16", "memory": "32Gi", "pods": "110"}
		status["capacity"], status["allocatable"] = size, size
	}
	patch, _ := json.Marshal(map[string]any{"status": status})
	if _, err := r.cs.CoreV1().Nodes().Patch(ctx, node.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		fmt.Fprintf(os.Stderr, "pod-runner: node %s: status: %v\n", node.Name, err)
	}
	leases := r.cs.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	duration := int32(40)
	for {
		renew := metav1.NewMicroTime(time.Now())
		lease, err := leases.Get(ctx, node.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			_, err = leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: node.Name, OwnerReferences: []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
				}}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &node.Name, LeaseDurationSeconds: &duration, RenewTime: &renew},
			}, metav1.CreateOptions{})
		case err == nil:
			lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime = &node.Name, &duration, &renew
			_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
		}
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "pod-runner: node %s: lease: %v\n", node.Name, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-stop:
			return
		case <-time.After(10 * time.Second):
		}
	}
}

// --- pods ----------------------------------------------------------------------------------

func (r *runner) podSeen(ctx context.Context, pod *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, known := r.pods[pod.UID]
	if !known {
		node, ours := r.nodes[pod.Spec.NodeName]
		if !ours || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			return
		}
		if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodRunning {
			// Deleted before it ran, or run by a runner before this one: not ours to start.
			if pod.DeletionTimestamp != nil {
				r.remove(ctx, pod)
			}
			return
		}
		p = &runningPod{pod: pod, done: make(chan struct{})}
		r.pods[pod.UID] = p
		if err := r.start(ctx, p, node); err != nil {
			fmt.Fprintf(os.Stderr, "pod-runner: pod %s/%s: %v\n", pod.Namespace, pod.Name, err)
			close(p.done)
			p.finished = true
			r.report(ctx, p, map[string]any{"phase": "Failed", "reason": "PodRunnerError", "message": err.Error()})
			r.cleanUp(p)
			delete(r.pods, pod.UID)
			return
		}
		r.writeHostsFiles()
		return
	}
	p.pod = pod
	if pod.DeletionTimestamp != nil && !p.deleting {
		p.deleting = true
		if p.finished {
			r.remove(ctx, pod)
			return
		}
		grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
		if pod.DeletionGracePeriodSeconds != nil {
			grace = *pod.DeletionGracePeriodSeconds
		}
		r.kill(p, syscall.SIGTERM)
		go func() {
			select {
			case <-p.done:
			case <-time.After(time.Duration(grace) * time.Second):
				r.locked(func() { r.kill(p, syscall.SIGKILL) })
			}
		}()
	}
}

// podGone: the pod object is gone (force-deleted, or garbage collected after its node).
func (r *runner) podGone(o any) {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = t.Obj
	}
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p, known := r.pods[pod.UID]
	if !known {
		return
	}
	p.lost = true
	if !p.finished {
		r.kill(p, syscall.SIGKILL)
		return // its exit cleans up
	}
	r.cleanUp(p)
	delete(r.pods, pod.UID)
	r.writeHostsFiles()
}

func (r *runner) kill(p *runningPod, sig syscall.Signal) {
	if p.cmd != nil && p.cmd.Process != nil && !p.finished {
		_ = syscall.Kill(-p.cmd.Process.Pid, sig) // its process group
	}
}

// remove deletes a pod whose container is not running: grace 0, only this very pod (its UID).
func (r *runner) remove(ctx context.Context, pod *corev1.Pod) {
	zero := int64(0)
	uid := pod.UID
	err := r.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &uid},
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		fmt.Fprintf(os.Stderr, "pod-runner: pod %s/%s: delete: %v\n", pod.Namespace, pod.Name, err)
	}
}

// report patches the pod's status (strategic merge: conditions and container statuses by key),
// only if the pod is still the one with this UID.
func (r *runner) report(ctx context.Context, p *runningPod, status map[string]any) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": p.pod.UID}, "status": status})
	_, err := r.cs.CoreV1().Pods(p.pod.Namespace).Patch(ctx, p.pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		fmt.Fprintf(os.Stderr, "pod-runner: pod %s/%s: status: %v\n", p.pod.Namespace, p.pod.Name, err)
	}
}

func condition(kind string, ok bool, now metav1.Time) map[string]any {
	status := "False"
	if ok {
		status = "True"
	}
	return map[string]any{"type": kind, "status": status, "lastTransitionTime": now}
}

// start sets up the pod's namespaces and files and starts its container.
func (r *runner) start(ctx context.Context, p *runningPod, node *runnerNode) error {
	pod := p.pod
	if len(pod.Spec.Containers) != 1 || len(pod.Spec.InitContainers) != 0 {
		return fmt.Errorf("spec.containers: the pod runner runs exactly one container and no init containers")
	}
	c := pod.Spec.Containers[0]
	p.dir = filepath.Join(r.state, "pods", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID)[:8])
	if err := os.MkdirAll(p.dir, 0o755); err != nil {
		return err
	}
	// Its address: the first free one of its node's /24.
	for p.octet = 2; p.octet < 255 && node.used[p.octet]; p.octet++ {
	}
	if p.octet == 255 {
		return fmt.Errorf("node %s has no pod address left", node.name)
	}
	node.used[p.octet] = true
	p.ip = addr(r.podNet, node.subnet, p.octet)
	id := strings.ReplaceAll(string(pod.UID), "-", "")[:10]
	p.netns, p.veth = r.bridge+"-"+id, "vp"+id // down.sh finds leftovers by the bridge's name
	ones, _ := r.podNet.Mask.Size()
	for _, args := range [][]string{
		{"netns", "add", p.netns},
		{"link", "add", p.veth, "type", "veth", "peer", "name", "eth0", "netns", p.netns},
		{"link", "set", p.veth, "master", r.bridge, "up"},
		{"-n", p.netns, "addr", "add", fmt.Sprintf("%s/%d", p.ip, ones), "dev", "eth0"},
		{"-n", p.netns, "link", "set", "eth0", "up"},
		{"-n", p.netns, "link", "set", "lo", "up"},
		{"-n", p.netns, "route", "add", "default", "via", r.hostIP.String()},
	} {
		if err := ipCmd(args...); err != nil {
			return err
		}
	}
	// Names: the hosts file is written (and rewritten) with the other pods'; no DNS server.
	etc := filepath.Join("/etc/netns", p.netns)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(etc, "hosts"), []byte("127.0.0.1 localhost\n"), 0o644); err != nil {
		return err
	}
	uid, gid := -1, -1
	if sc := pod.Spec.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = int(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			gid = int(*sc.RunAsGroup)
		}
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.RunAsUser != nil {
			uid = int(*sc.RunAsUser)
		}
		if sc.RunAsGroup != nil {
			gid = int(*sc.RunAsGroup)
		}
	}
	if gid < 0 {
		gid = uid
	}
	mounts, err := r.volumes(ctx, pod, c, p.dir, uid, gid)
	if err != nil {
		return err
	}
	messagePath := c.TerminationMessagePath
	if messagePath == "" {
		messagePath = corev1.TerminationMessagePathDefault
	}
	message := filepath.Join(p.dir, "termination-log")
	if err := os.WriteFile(message, nil, 0o666); err != nil {
		return err
	}
	_ = os.Chmod(message, 0o666)
	mounts = append(mounts, [2]string{message, messagePath})

	// The command: a shell in the pod's namespaces mounts the volumes, sets the hostname, drops
	// to the pod's user and execs the container's command, which keeps the shell's pid.
	hostname := pod.Spec.Hostname
	if hostname == "" {
		hostname = pod.Name
	}
	var script strings.Builder
	script.WriteString("set -e\nhostname " + quote(hostname) + "\n")
	// Every source is opened before anything is mounted, and mounted through its descriptor: a
	// mount over /tmp must not hide the sources that live under /tmp.
	if len(mounts) > 7 {
		return fmt.Errorf("volumeMounts: the pod runner mounts at most 6 volumes")
	}
	for i, m := range mounts {
		fmt.Fprintf(&script, "exec %d< %s\n", i+3, quote(m[0]))
	}
	for i, m := range mounts {
		src, dst := m[0], m[1]
		if info, err := os.Stat(src); err == nil && !info.IsDir() {
			fmt.Fprintf(&script, "mkdir -p %s; [ -e %s ] || : > %s\n", quote(filepath.Dir(dst)), quote(dst), quote(dst))
		} else {
			fmt.Fprintf(&script, "mkdir -p %s\n", quote(dst))
		}
		fmt.Fprintf(&script, "mount --bind /proc/self/fd/%d %s\nexec %d<&-\n", i+3, quote(dst), i+3)
	}
	script.WriteString("exec")
	if uid >= 0 {
		fmt.Fprintf(&script, " setpriv --reuid=%d --regid=%d --clear-groups --no-new-privs --", uid, gid)
	}
	script.WriteString(` "$@"`)
	command := append([]string{}, c.Command...)
	if len(command) == 0 || filepath.Base(command[0]) == filepath.Base(r.entrypoint) {
		command = append([]string{r.entrypoint}, command[min(1, len(command)):]...)
	}
	command = append(command, c.Args...)
	args := append([]string{"netns", "exec", p.netns, "unshare", "--uts", "--", "sh", "-c", script.String(), "container"}, command...)
	cmd := exec.Command("ip", args...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOSTNAME=" + hostname}
	for _, e := range c.Env {
		if e.ValueFrom != nil {
			return fmt.Errorf("env %s: valueFrom is not supported by the pod runner", e.Name)
		}
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	cmd.Dir = "/"
	logFile, err := os.Create(filepath.Join(p.dir, "container.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %v: %v", command, err)
	}
	p.cmd, p.started = cmd, metav1.Now()
	fmt.Fprintf(os.Stderr, "pod-runner: pod %s/%s on %s: %s, pid %d\n", pod.Namespace, pod.Name, pod.Spec.NodeName, p.ip, cmd.Process.Pid)
	r.report(ctx, p, map[string]any{
		"phase": "Running", "hostIP": r.hostIP.String(), "hostIPs": []map[string]string{{"ip": r.hostIP.String()}},
		"podIP": p.ip.String(), "podIPs": []map[string]string{{"ip": p.ip.String()}}, "startTime": p.started,
		"conditions": []map[string]any{
			condition("PodReadyToStartContainers", true, p.started), condition("Initialized", true, p.started),
			condition("ContainersReady", false, p.started), condition("Ready", false, p.started),
		},
		"containerStatuses": []map[string]any{r.containerStatus(p, map[string]any{"running": map[string]any{"startedAt": p.started}})},
	})
	go r.waitFor(ctx, p)
	if probe := c.ReadinessProbe; probe != nil && probe.HTTPGet != nil {
		go r.probe(ctx, p, c, probe)
	}
	return nil
}

func (r *runner) containerStatus(p *runningPod, state map[string]any) map[string]any {
	c := p.pod.Spec.Containers[0]
	return map[string]any{
		"name": c.Name, "image": c.Image, "imageID": "", "containerID": fmt.Sprintf("murmur-pod-runner://%d", p.cmd.Process.Pid),
		"ready": p.ready && state["running"] != nil, "started": state["running"] != nil, "restartCount": 0, "state": state,
	}
}

// waitFor reports the container's exit, and removes the pod when it was being deleted.
func (r *runner) waitFor(ctx context.Context, p *runningPod) {
	err := p.cmd.Wait()
	code := 0
	if exit, ok := err.(*exec.ExitError); ok {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		} else {
			code = exit.ExitCode()
		}
	} else if err != nil {
		code = 128
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p.finished = true
	close(p.done)
	if !p.lost {
		now := metav1.Now()
		c := p.pod.Spec.Containers[0]
		message := readTail(filepath.Join(p.dir, "termination-log"), 4096)
		if message == "" && code != 0 && c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError {
			message = readTail(filepath.Join(p.dir, "container.log"), 2048)
		}
		reason, phase := "Completed", "Succeeded"
		if code != 0 {
			reason, phase = "Error", "Failed"
		}
		p.ready = false
		terminated := map[string]any{"exitCode": code, "reason": reason, "startedAt": p.started, "finishedAt": now}
		if message != "" {
			terminated["message"] = message
		}
		r.report(ctx, p, map[string]any{
			"phase":             phase,
			"conditions":        []map[string]any{condition("ContainersReady", false, now), condition("Ready", false, now)},
			"containerStatuses": []map[string]any{r.containerStatus(p, map[string]any{"terminated": terminated})},
		})
		if p.deleting {
			r.remove(ctx, p.pod)
		}
	}
	fmt.Fprintf(os.Stderr, "pod-runner: pod %s/%s exited %d\n", p.pod.Namespace, p.pod.Name, code)
	r.cleanUp(p)
	if p.lost || p.deleting {
		delete(r.pods, p.pod.UID)
	}
	r.writeHostsFiles()
}

// probe runs the container's HTTP readiness probe against its address, as the kubelet does.
func (r *runner) probe(ctx context.Context, p *runningPod, c corev1.Container, probe *corev1.Probe) {
	port := probe.HTTPGet.Port.IntValue()
	if probe.HTTPGet.Port.Type == intstr.String {
		for _, cp := range c.Ports {
			if cp.Name == probe.HTTPGet.Port.StrVal {
				port = int(cp.ContainerPort)
			}
		}
	}
	url := fmt.Sprintf("http://%s/%s", net.JoinHostPort(p.ip.String(), strconv.Itoa(port)), strings.TrimPrefix(probe.HTTPGet.Path, "/"))
	period := time.Duration(max(probe.PeriodSeconds, 1)) * time.Second
	client := http.Client{Timeout: time.Duration(max(probe.TimeoutSeconds, 1)) * time.Second}
	failures := 0
	for {
		// Until ready, every half second: the first success should not wait a whole period.
		wait := period
		r.mu.Lock()
		if !p.ready {
			wait = 500 * time.Millisecond
		}
		r.mu.Unlock()
		select {
		case <-p.done:
			return
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		ok := false
		if resp, err := client.Get(url); err == nil {
			ok = resp.StatusCode >= 200 && resp.StatusCode < 400
			resp.Body.Close()
		}
		if ok {
			failures = 0
		} else {
			failures++
		}
		r.mu.Lock()
		change := (ok && !p.ready) || (!ok && p.ready && failures >= int(max(probe.FailureThreshold, 1)))
		if change && !p.finished && !p.lost {
			p.ready = ok
			now := metav1.Now()
			r.report(ctx, p, map[string]any{
				"conditions":        []map[string]any{condition("ContainersReady", ok, now), condition("Ready", ok, now)},
				"containerStatuses": []map[string]any{r.containerStatus(p, map[string]any{"running": map[string]any{"startedAt": p.started}})},
			})
			r.writeHostsFiles()
		}
		r.mu.Unlock()
	}
}

// cleanUp removes the pod's network namespace, veth and files, and frees its address.
func (r *runner) cleanUp(p *runningPod) {
	if p.netns != "" {
		_ = ipCmd("netns", "del", p.netns)
		_ = ipCmd("link", "del", p.veth)
		_ = os.RemoveAll(filepath.Join("/etc/netns", p.netns))
		p.netns = ""
	}
	if n, ok := r.nodes[p.pod.Spec.NodeName]; ok && p.octet != 0 {
		delete(n.used, p.octet)
		p.octet = 0
	}
}

// volumes writes the pod's volumes under dir and returns (source, mount path) pairs.
func (r *runner) volumes(ctx context.Context, pod *corev1.Pod, c corev1.Container, dir string, uid, gid int) ([][2]string, error) {
	fsGroup := gid
	if sc := pod.Spec.SecurityContext; sc != nil && sc.FSGroup != nil {
		fsGroup = int(*sc.FSGroup)
	}
	var mounts [][2]string
	for _, m := range c.VolumeMounts {
		var v *corev1.Volume
		for i := range pod.Spec.Volumes {
			if pod.Spec.Volumes[i].Name == m.Name {
				v = &pod.Spec.Volumes[i]
			}
		}
		if v == nil {
			return nil, fmt.Errorf("volumeMounts %s: no such volume", m.Name)
		}
		src := filepath.Join(dir, "volumes", v.Name)
		if err := os.MkdirAll(src, 0o755); err != nil {
			return nil, err
		}
		var files map[string][]byte
		mode := int32(0o644)
		var items []corev1.KeyToPath
		switch {
		case v.EmptyDir != nil:
			_ = os.Chmod(src, 0o1777)
		case v.PersistentVolumeClaim != nil:
			// A claim is a directory that outlives its pods.
			src = filepath.Join(r.state, "claims", pod.Namespace, v.PersistentVolumeClaim.ClaimName)
			if err := os.MkdirAll(src, 0o777); err != nil {
				return nil, err
			}
			_ = os.Chmod(src, 0o1777)
		case v.Secret != nil:
			s, err := r.cs.CoreV1().Secrets(pod.Namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("volume %s: secret %s: %v", v.Name, v.Secret.SecretName, err)
			}
			files, items = s.Data, v.Secret.Items
			if v.Secret.DefaultMode != nil {
				mode = *v.Secret.DefaultMode
			}
		case v.ConfigMap != nil:
			cm, err := r.cs.CoreV1().ConfigMaps(pod.Namespace).Get(ctx, v.ConfigMap.Name, metav1.GetOptions{})
			if err != nil {
				return nil, fmt.Errorf("volume %s: configmap %s: %v", v.Name, v.ConfigMap.Name, err)
			}
			files = map[string][]byte{}
			for k, val := range cm.Data {
				files[k] = []byte(val)
			}
			items = v.ConfigMap.Items
			if v.ConfigMap.DefaultMode != nil {
				mode = *v.ConfigMap.DefaultMode
			}
		default:
			return nil, fmt.Errorf("volume %s: only emptyDir, persistentVolumeClaim, secret and configMap volumes are supported by the pod runner", v.Name)
		}
		paths := map[string]string{}
		if len(items) > 0 {
			for _, it := range items {
				if _, ok := files[it.Key]; !ok {
					return nil, fmt.Errorf("volume %s: no key %s", v.Name, it.Key)
				}
				paths[it.Key] = it.Path
			}
		} else {
			for k := range files {
				paths[k] = k
			}
		}
		keys := make([]string, 0, len(paths))
		for k := range paths {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			file := filepath.Join(src, paths[k])
			if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(file, files[k], os.FileMode(mode)); err != nil {
				return nil, err
			}
			// Readable by the pod's user: owned by it, group fsGroup, as a kubelet sets them.
			if uid >= 0 {
				_ = os.Chown(file, uid, fsGroup)
			}
		}
		if uid >= 0 && (v.EmptyDir != nil || v.PersistentVolumeClaim != nil) {
			_ = os.Chown(src, uid, fsGroup)
		}
		if m.SubPath != "" {
			return nil, fmt.Errorf("volumeMounts %s: subPath is not supported by the pod runner", m.Name)
		}
		mounts = append(mounts, [2]string{src, m.MountPath})
	}
	return mounts, nil
}

// writeHostsFiles writes every running pod's hosts file: itself, the pods its namespace's
// headless Services publish (hostname.subdomain.namespace.svc.DOMAIN, as cluster DNS answers),
// and the aliases. Written in place: ip netns exec bind-mounted the file, not its directory.
func (r *runner) writeHostsFiles() {
	type entry struct{ ip, names string }
	published := map[string][]entry{} // namespace -> entries
	for _, p := range r.pods {
		if p.netns == "" || p.finished || p.lost {
			continue
		}
		pod := p.pod
		if pod.Spec.Hostname == "" || pod.Spec.Subdomain == "" {
			continue
		}
		svc, err := r.services.Services(pod.Namespace).Get(pod.Spec.Subdomain)
		if err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone ||
			!labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(pod.Labels)) ||
			!(p.ready || svc.Spec.PublishNotReadyAddresses) {
			continue
		}
		short := pod.Spec.Hostname + "." + pod.Spec.Subdomain + "." + pod.Namespace + ".svc"
		published[pod.Namespace] = append(published[pod.Namespace], entry{p.ip.String(), short + "." + r.clusterDomain + " " + short})
	}
	aliases := make([]string, 0, len(r.aliases))
	for name, address := range r.aliases {
		aliases = append(aliases, address+" "+name)
	}
	sort.Strings(aliases)
	for _, p := range r.pods {
		if p.netns == "" {
			continue
		}
		var b strings.Builder
		b.WriteString("# written by the murmur pod runner\n127.0.0.1 localhost\n")
		hostname := p.pod.Spec.Hostname
		if hostname == "" {
			hostname = p.pod.Name
		}
		fmt.Fprintf(&b, "%s %s\n", p.ip, hostname)
		entries := published[p.pod.Namespace]
		sort.Slice(entries, func(i, j int) bool { return entries[i].names < entries[j].names })
		for _, e := range entries {
			fmt.Fprintf(&b, "%s %s\n", e.ip, e.names)
		}
		for _, a := range aliases {
			b.WriteString(a + "\n")
		}
		path := filepath.Join("/etc/netns", p.netns, "hosts")
		if old, err := os.ReadFile(path); err == nil && string(old) == b.String() {
			continue
		}
		if f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0o644); err == nil {
			_, _ = f.WriteString(b.String())
			_ = f.Close()
		}
	}
}

func readTail(path string, limit int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > limit {
		b = b[len(b)-limit:]
	}
	return strings.TrimSpace(string(b))
}

// quote makes s one word for sh.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
