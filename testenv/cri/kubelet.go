package cri

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// KubeletConfig says where a Kubelet runs and whom it serves.
type KubeletConfig struct {
	// Dir holds everything the kubelet owns (its configuration, root
	// directory, pod logs, log); Stop removes it.
	Dir string
	// NetNS is the lab node's network namespace (/run/netns/<name>), the one
	// its Containerd runs in.
	NetNS string
	// NodeName is the lab Node the kubelet reports as (--hostname-override);
	// NodeIP its InternalIP (--node-ip), so the kubelet's status update keeps
	// the address the lab gave the Node.
	NodeName string
	NodeIP   netip.Addr
	// Kubeconfig reaches the API server from inside NetNS (the lab's).
	Kubeconfig string
	// Runtime is the node's containerd, the kubelet's CRI endpoint.
	Runtime *Containerd
	// Binary is the kubelet (kubebin.Kubelet).
	Binary string
	// ClusterDNS is the cluster DNS the kubelet writes into its pods'
	// resolv.conf (clusterDNS: the kube-dns Service's ClusterIP,
	// kube.ClusterDNSIP), with ClusterDomain's search paths (clusterDomain,
	// kube.ClusterDomain). Without it pods of dnsPolicy ClusterFirst get no
	// nameserver, as on a cluster that has no DNS.
	ClusterDNS    []netip.Addr
	ClusterDomain string
	// ClientCAFile, when set, is the CA whose client certificates the
	// kubelet accepts on its API (port 10250): the API server's (kube.Server
	// CAFile), for exec, logs and port-forward. Unset, the kubelet accepts
	// no client.
	ClientCAFile string
}

// Kubelet is a running kubelet.
type Kubelet struct {
	cfg      KubeletConfig
	cmd      *exec.Cmd
	done     chan struct{}  // closed when the kubelet has been reaped
	hostDirs *hostDirsLease // its use of kubeletFixedDirs on the host
}

// kubeletPrograms are the programs StartKubelet runs, each listed in
// hack/programs.tsv.
var kubeletPrograms = []string{"nsenter", "unshare", "sh", "mount", "findmnt"}

// kubeletSysctls are the kernel settings a kubelet writes at start
// (setupKernelTunables in pkg/kubelet/cm): they are not namespaced, so the
// kubelet gets files of its own over them (see StartKubelet).
var kubeletSysctls = []string{
	"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
	"kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes",
}

// kubeletFixedDirs are directories a kubelet uses whatever its root
// directory: its device plugin socket (pluginapi.DevicePluginPath; a second
// kubelet would take the first one's socket away) and the links to container
// logs (/var/log/containers). Each kubelet gets directories of its own
// mounted over them, named by the base name under KubeletConfig.Dir.
var kubeletFixedDirs = []string{"/var/lib/kubelet/device-plugins", "/var/log/containers"}

// StartKubelet writes a kubelet configuration for this machine and starts the
// kubelet in cfg.NetNS, waiting until its healthz answers. The caller must
// Stop it, also when a later step fails.
//
// The kubelet runs in a mount namespace of its own in which each of
// kubeletSysctls is a file of its own holding the machine's value: a kubelet
// sets vm.overcommit_memory=1, kernel.panic_on_oops=1 and others machine-wide,
// which a test must not do to a shared machine. It also gives the kubelet
// directories of its own over kubeletFixedDirs (whose mount points it creates
// on the host when missing, and the last kubelet to stop removes: see
// hostDirsRegistry); each mount containing a bind target is made private
// there first, so none of these binds reaches the host. The kubelet's root
// directory is the exception: it is bind mounted on itself on the host with
// shared propagation before the namespace is made,
// so the volumes the kubelet mounts under it (the service account token's
// tmpfs, projected and secret volumes) appear on the host too, where
// containerd, which mounts the pods' volumes in the host's namespace, finds
// them. The pods' mounts are containerd's.
func StartKubelet(ctx context.Context, cfg KubeletConfig) (*Kubelet, error) {
	for _, p := range kubeletPrograms {
		if err := programs.Require(p); err != nil {
			return nil, fmt.Errorf("start kubelet: %w", err)
		}
	}
	for _, d := range []string{"root", "pod-logs", "sysctl"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("create kubelet dir: %w", err)
		}
	}
	conf := filepath.Join(cfg.Dir, "config.yaml")
	if err := os.WriteFile(conf, []byte(kubeletConfigYAML(cfg)), 0o644); err != nil {
		return nil, fmt.Errorf("write kubelet config: %w", err)
	}
	var binds []string
	for _, s := range kubeletSysctls {
		cur, err := os.ReadFile(filepath.Join("/proc/sys", s))
		if err != nil {
			return nil, fmt.Errorf("read sysctl %s: %w", s, err)
		}
		shadow := filepath.Join(cfg.Dir, "sysctl", strings.ReplaceAll(s, "/", "."))
		if err := os.WriteFile(shadow, cur, 0o644); err != nil {
			return nil, fmt.Errorf("write sysctl shadow: %w", err)
		}
		binds = append(binds, privateBind(shadow, "/proc/sys/"+s))
	}
	for _, d := range kubeletFixedDirs {
		own := filepath.Join(cfg.Dir, filepath.Base(d))
		if err := os.MkdirAll(own, 0o755); err != nil {
			return nil, fmt.Errorf("create kubelet dir: %w", err)
		}
		binds = append(binds, privateBind(own, d))
	}
	hostDirs, err := acquireHostDirs(ctx, hostDirsRegistry, kubeletFixedDirs)
	if err != nil {
		return nil, fmt.Errorf("start kubelet: %w", err)
	}
	logf, err := os.Create(filepath.Join(cfg.Dir, "kubelet.log"))
	if err != nil {
		hostDirs.release()
		return nil, fmt.Errorf("create kubelet log: %w", err)
	}
	defer logf.Close()
	root := filepath.Join(cfg.Dir, "root")
	if err := syscall.Mount(root, root, "", syscall.MS_BIND, ""); err != nil {
		hostDirs.release()
		return nil, fmt.Errorf("bind mount kubelet root %s: %w", root, err)
	}
	if err := syscall.Mount("", root, "", syscall.MS_SHARED, ""); err != nil {
		syscall.Unmount(root, syscall.MNT_DETACH)
		hostDirs.release()
		return nil, fmt.Errorf("share kubelet root %s: %w", root, err)
	}
	script := strings.Join(binds, " && ") + ` && exec "$@"`
	argv := []string{"--net=" + cfg.NetNS, "unshare", "--mount", "--propagation", "unchanged",
		"sh", "-c", script, "kubelet",
		cfg.Binary,
		"--config", conf,
		"--kubeconfig", cfg.Kubeconfig,
		"--root-dir", root,
		"--cert-dir", filepath.Join(cfg.Dir, "root", "pki"),
		"--hostname-override", cfg.NodeName,
		"--node-ip", cfg.NodeIP.String(),
		"--v", "2",
	}
	cmd := exec.Command("nsenter", argv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		unmountUnder(cfg.Dir)
		hostDirs.release()
		return nil, fmt.Errorf("start kubelet: %w", err)
	}
	k := &Kubelet{cfg: cfg, cmd: cmd, done: make(chan struct{}), hostDirs: hostDirs}
	go func() { cmd.Wait(); close(k.done) }()
	if err := k.waitHealthy(ctx, 60*time.Second); err != nil {
		return k, err
	}
	return k, nil
}

// privateBind is the shell command that bind mounts src over dst in the
// kubelet's mount namespace after making the mount that holds dst private
// there, so that the bind does not propagate to the host.
func privateBind(src, dst string) string {
	return fmt.Sprintf(`mount --make-private "$(findmnt -n -o TARGET --target %s)" && mount --bind %s %s`, dst, src, dst)
}

// kubeletHealthzPort is where the kubelet answers /healthz, on the node
// namespace's loopback.
const kubeletHealthzPort = 10248

// waitHealthy polls the kubelet's healthz until it answers 200, the kubelet
// exits, or the timeout.
func (k *Kubelet) waitHealthy(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if err := k.healthz(); err == nil {
			return nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("kubelet %s not healthy after %s: %w\n%s", k.cfg.NodeName, timeout, err, k.LogTail())
		}
		select {
		case <-k.done:
			return fmt.Errorf("kubelet %s exited: %s", k.cfg.NodeName, k.LogTail())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// healthz asks the kubelet's /healthz on the loopback of its network
// namespace. The connection is dialled on a thread in that namespace (an
// http.Transport would dial from another goroutine, in the host's).
func (k *Kubelet) healthz() error {
	var conn net.Conn
	err := testenv.Do(filepath.Base(k.cfg.NetNS), func() (err error) {
		conn, err = net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(kubeletHealthzPort)), time.Second)
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(conn, "GET /healthz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n"); err != nil {
		return fmt.Errorf("kubelet healthz: %w", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return fmt.Errorf("kubelet healthz: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("kubelet healthz: %s", resp.Status)
	}
	return nil
}

// kubeletConfigYAML is the KubeletConfiguration for this machine (cgroup v1
// controllers, no QoS cgroups, no allocatable enforcement), every path under
// cfg.Dir, and cfg.Runtime as the CRI endpoint.
func kubeletConfigYAML(cfg KubeletConfig) string {
	q := strconv.Quote
	ep := "unix://" + cfg.Runtime.Socket()
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 controllers; kubelet 1.35 and later refuse
# them unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
containerRuntimeEndpoint: %s
imageServiceEndpoint: %s
podLogsDir: %s
staticPodPath: ""
resolvConf: ""
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: %s
authorization:
  mode: AlwaysAllow
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: %d
# The images are imported, no registry is reachable: never collect them,
# never evict for a disk the other engineers fill.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "1%%"
  imagefs.available: "1%%"
localStorageCapacityIsolation: false
oomScoreAdj: 0
nodeStatusUpdateFrequency: 2s
syncFrequency: 10s
`, q(ep), q(ep), q(filepath.Join(cfg.Dir, "pod-logs")), q(cfg.ClientCAFile), kubeletHealthzPort) + clusterDNSYAML(cfg)
}

// clusterDNSYAML is the KubeletConfiguration's clusterDNS and clusterDomain
// of cfg, or nothing.
func clusterDNSYAML(cfg KubeletConfig) string {
	var b strings.Builder
	if len(cfg.ClusterDNS) > 0 {
		b.WriteString("clusterDNS:\n")
		for _, a := range cfg.ClusterDNS {
			fmt.Fprintf(&b, "- %s\n", strconv.Quote(a.String()))
		}
	}
	if cfg.ClusterDomain != "" {
		fmt.Fprintf(&b, "clusterDomain: %s\n", strconv.Quote(cfg.ClusterDomain))
	}
	return b.String()
}

// LogTail returns the last lines of the kubelet's log.
func (k *Kubelet) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(k.cfg.Dir, "kubelet.log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

// Stop ends the kubelet (SIGTERM, then SIGKILL), unmounts what is left under
// Dir, removes it and, if it is the last kubelet on the machine, the mount
// points StartKubelet created. The pods it started stay with the runtime:
// Containerd.Stop removes them. It reports what it could not undo.
func (k *Kubelet) Stop() error {
	var errs []error
	select {
	case <-k.done:
	default:
		k.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-k.done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
			<-k.done
		}
	}
	if err := unmountUnder(k.cfg.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(k.cfg.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove kubelet dir: %w", err))
	}
	if err := k.hostDirs.release(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("stop kubelet %s: %w", k.cfg.NodeName, errors.Join(errs...))
	}
	return nil
}

// mkdirAllRecorded is os.MkdirAll returning the directories it made,
// outermost first.
func mkdirAllRecorded(dir string) ([]string, error) {
	var missing []string
	for d := dir; d != "/"; d = filepath.Dir(d) {
		if _, err := os.Stat(d); err == nil {
			break
		}
		missing = append([]string{d}, missing...)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", dir, err)
	}
	return missing, nil
}

// removeDirs removes directories made by mkdirAllRecorded, innermost first.
func removeDirs(dirs []string) error {
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
			errs = append(errs, fmt.Errorf("remove %s: %w", dirs[i], err))
		}
	}
	return errors.Join(errs...)
}
