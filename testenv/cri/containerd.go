// Package cri runs a private containerd (with runc) in a lab node's network
// namespace and drives it through CRI with crictl, so that tests see pod
// sandboxes made by a real container runtime through the isthmus CNI plugin
// (docs/cni.md). Everything one instance owns (config, root, state, sockets,
// logs, the pods' network namespaces) lives under its own directory, so
// several run side by side, one per node, independent of any containerd on
// the host. The images come from BuildImages: no registry is reachable.
package cri

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/isthmus-dev/isthmus/testenv/programs"
)

// Config says where a Containerd runs and what it runs.
type Config struct {
	// Dir holds everything the instance owns; Stop removes it. Keep it short:
	// unix socket paths under it must fit in 108 bytes.
	Dir string
	// NetNS is the network namespace containerd and the CNI plugin run in (a
	// lab node's, /run/netns/<name>); the pods get namespaces of their own.
	NetNS string
	// CNIBinDir and CNIConfDir are where the runtime finds the plugin and the
	// network configuration: the agent's --cni-bin-dir and --cni-conf-dir.
	CNIBinDir, CNIConfDir string
	// Crictl is the crictl binary (kubebin.Crictl).
	Crictl string
	// Bridge, when set, makes the node's CNI another one than isthmus: Start
	// installs the reference plugins and Bridge's conflist into CNIBinDir
	// and CNIConfDir (InstallBridgeCNI), as a node of a site whose pods
	// another CNI owns has them before isthmus comes.
	Bridge *BridgeCNI
	// SandboxImage is the image of every pod's sandbox container, which
	// must be imported before the first pod starts; "" is PauseImage.
	// Kubernetes' own tests expect their release's pause image
	// (testenv/kube/e2eimages).
	SandboxImage string
}

// Containerd is a running private containerd.
type Containerd struct {
	cfg     Config
	cmd     *exec.Cmd
	done    chan struct{}   // closed when containerd has been reaped
	cgroups map[string]bool // the CRI namespace's cgroup directories before it started
}

// Programs the package runs, each listed in hack/programs.tsv.
var runtimePrograms = []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "nsenter"}

// Start writes a private configuration and starts containerd in cfg.NetNS,
// waiting until it answers on its socket. The caller must Stop it, also when
// a later step fails.
func Start(ctx context.Context, cfg Config) (*Containerd, error) {
	for _, p := range runtimePrograms {
		if err := programs.Require(p); err != nil {
			return nil, fmt.Errorf("start containerd: %w", err)
		}
	}
	for _, d := range []string{"root", "state", "logs", "runc"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("create containerd dir: %w", err)
		}
	}
	if cfg.Bridge != nil {
		if err := InstallBridgeCNI(ctx, cfg.CNIBinDir, cfg.CNIConfDir, *cfg.Bridge); err != nil {
			return nil, fmt.Errorf("start containerd: %w", err)
		}
	}
	conf := filepath.Join(cfg.Dir, "config.toml")
	if err := os.WriteFile(conf, []byte(configTOML(cfg)), 0o644); err != nil {
		return nil, fmt.Errorf("write containerd config: %w", err)
	}
	logf, err := os.Create(filepath.Join(cfg.Dir, "containerd.log"))
	if err != nil {
		return nil, fmt.Errorf("create containerd log: %w", err)
	}
	defer logf.Close()
	// nsenter --net, not ip netns exec, which would remount /sys in a mount
	// namespace of its own: containerd mounts the pods' root filesystems and
	// network namespaces in the host's mount namespace, under cfg.Dir.
	cgroups, err := cgroupDirs()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("nsenter", "--net="+cfg.NetNS, "containerd", "--config", conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}
	c := &Containerd{cfg: cfg, cmd: cmd, done: make(chan struct{}), cgroups: cgroups}
	go func() { cmd.Wait(); close(c.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := c.Crictl(ctx, "version"); err == nil {
			return c, nil
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			return c, fmt.Errorf("containerd in %s does not answer: %w\n%s", cfg.NetNS, err, c.LogTail())
		}
		select {
		case <-c.done:
			return c, fmt.Errorf("containerd in %s exited: %s", cfg.NetNS, c.LogTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Socket is containerd's gRPC socket, which serves CRI too.
func (c *Containerd) Socket() string { return filepath.Join(c.cfg.Dir, "containerd.sock") }

// LogTail returns the last lines of containerd's log.
func (c *Containerd) LogTail() string {
	b, _ := os.ReadFile(filepath.Join(c.cfg.Dir, "containerd.log"))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// configTOML is containerd 1.6's configuration (version 2) for cfg: every
// path under cfg.Dir, the CRI plugin's CNI pointed at the agent's
// directories, the local pause image (or cfg.SandboxImage) as the sandbox image, runc through the
// v2 shim, and the pods' network namespaces under the state directory.
// restrict_oom_score_adj: a sandbox may not lower its OOM score below
// containerd's own where the tests run as a confined root (this machine:
// runc's write of -998 fails with EPERM).
func configTOML(cfg Config) string {
	q := strconv.Quote
	sandbox := cfg.SandboxImage
	if sandbox == "" {
		sandbox = PauseImage
	}
	return fmt.Sprintf(`version = 2
root = %s
state = %s

[grpc]
  address = %s
[ttrpc]
  address = %s
[debug]
  address = %s

[plugins."io.containerd.internal.v1.opt"]
  path = %s

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %s
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %s
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %s
    conf_dir = %s
    max_conf_num = 1
`, q(filepath.Join(cfg.Dir, "root")), q(filepath.Join(cfg.Dir, "state")),
		q(filepath.Join(cfg.Dir, "containerd.sock")), q(filepath.Join(cfg.Dir, "containerd.sock.ttrpc")),
		q(filepath.Join(cfg.Dir, "debug.sock")), q(filepath.Join(cfg.Dir, "opt")),
		q(sandbox), q(filepath.Join(cfg.Dir, "runc")), q(cfg.CNIBinDir), q(cfg.CNIConfDir))
}

// Import imports an image archive (BuildImages) into the CRI namespace,
// unpacked for the CRI snapshotter.
func (c *Containerd) Import(ctx context.Context, archive string) error {
	out, err := exec.CommandContext(ctx, "ctr", "--address", c.Socket(), "--namespace", "k8s.io",
		"images", "import", archive).CombinedOutput()
	if err != nil {
		return fmt.Errorf("import %s: %w\n%s", filepath.Base(archive), err, out)
	}
	return nil
}

// Crictl runs crictl against this containerd, in its network namespace (exec
// and logs reach the CRI streaming server on the namespace's loopback), and
// returns its standard output.
func (c *Containerd) Crictl(ctx context.Context, args ...string) (string, error) {
	ep := "unix://" + c.Socket()
	argv := append([]string{"--net=" + c.cfg.NetNS, c.cfg.Crictl, "--runtime-endpoint", ep, "--image-endpoint", ep, "--timeout", "20s"}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", argv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("crictl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// WaitNetworkReady waits until the CRI plugin reports NetworkReady: it has
// loaded a network configuration from CNIConfDir (the agent writes it only
// after it verified the node's podCIDRs). Until then the runtime creates no
// sandbox.
func (c *Containerd) WaitNetworkReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		out, err := c.Crictl(ctx, "info")
		if err == nil {
			var info struct {
				Status struct {
					Conditions []struct {
						Type    string `json:"type"`
						Status  bool   `json:"status"`
						Reason  string `json:"reason"`
						Message string `json:"message"`
					} `json:"conditions"`
				} `json:"status"`
			}
			if err := json.Unmarshal([]byte(out), &info); err != nil {
				return fmt.Errorf("decode crictl info: %w", err)
			}
			for _, cond := range info.Status.Conditions {
				if cond.Type == "NetworkReady" {
					if cond.Status {
						return nil
					}
					last = cond.Reason + ": " + cond.Message
				}
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("containerd in %s: network not ready after %s: %s", c.cfg.NetNS, timeout, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Pod is a pod sandbox the runtime made.
type Pod struct {
	ID    string // the sandbox ID: the CNI ContainerID of its attachment
	Name  string
	IP    string // as the runtime reports it, from the CNI result
	NetNS string // path of the pod's network namespace
}

// RunPod creates a pod sandbox named name (crictl runp): the runtime makes
// its network namespace and calls the CNI plugin's ADD.
func (c *Containerd) RunPod(ctx context.Context, name string) (Pod, error) {
	p, err := c.runPod(ctx, name, map[string]any{})
	if err != nil {
		return p, err
	}
	return c.inspectPod(ctx, p)
}

// ReadyPod returns the ready pod sandbox of a Pod object (a kubelet names
// its sandbox after the Pod's name and namespace), with its address and
// network namespace.
func (c *Containerd) ReadyPod(ctx context.Context, namespace, name string) (Pod, error) {
	out, err := c.Crictl(ctx, "pods", "--namespace", namespace, "--name", "^"+name+"$", "--state", "ready", "--quiet")
	if err != nil {
		return Pod{}, err
	}
	ids := strings.Fields(out)
	if len(ids) != 1 {
		return Pod{}, fmt.Errorf("ready sandboxes of pod %s/%s: %q, want one", namespace, name, ids)
	}
	return c.inspectPod(ctx, Pod{ID: ids[0], Name: name})
}

// Container returns the ID of the running container named name in a pod.
func (c *Containerd) Container(ctx context.Context, p Pod, name string) (string, error) {
	out, err := c.Crictl(ctx, "ps", "--pod", p.ID, "--name", "^"+name+"$", "--state", "running", "--quiet")
	if err != nil {
		return "", err
	}
	ids := strings.Fields(out)
	if len(ids) != 1 {
		return "", fmt.Errorf("running containers %s in pod %s: %q, want one", name, p.Name, ids)
	}
	return ids[0], nil
}

// RunHostNetworkPod creates a pod sandbox in containerd's own network
// namespace: no CNI call, so it tests the runtime and the images alone. Its
// Pod has no IP and no NetNS.
func (c *Containerd) RunHostNetworkPod(ctx context.Context, name string) (Pod, error) {
	const nodeNamespace = 2 // runtime.v1.NamespaceMode NODE
	return c.runPod(ctx, name, map[string]any{
		"security_context": map[string]any{"namespace_options": map[string]any{"network": nodeNamespace}},
	})
}

func (c *Containerd) runPod(ctx context.Context, name string, linux map[string]any) (Pod, error) {
	// No hostname: a pod on the node's network shares its UTS namespace too.
	spec, err := c.writeJSON(name+"-pod.json", map[string]any{
		"metadata":      map[string]any{"name": name, "namespace": "isthmus-test", "uid": name + "-uid", "attempt": 0},
		"log_directory": filepath.Join(c.cfg.Dir, "logs", name),
		"linux":         linux,
	})
	if err != nil {
		return Pod{}, err
	}
	out, err := c.Crictl(ctx, "runp", spec)
	if err != nil {
		return Pod{}, err
	}
	return Pod{ID: strings.TrimSpace(out), Name: name}, nil
}

// inspectPod fills in the pod's address and network namespace from crictl
// inspectp.
func (c *Containerd) inspectPod(ctx context.Context, p Pod) (Pod, error) {
	out, err := c.Crictl(ctx, "inspectp", p.ID)
	if err != nil {
		return p, err
	}
	var res struct {
		Status struct {
			Network struct {
				IP string `json:"ip"`
			} `json:"network"`
		} `json:"status"`
		Info struct {
			RuntimeSpec struct {
				Linux struct {
					Namespaces []struct {
						Type string `json:"type"`
						Path string `json:"path"`
					} `json:"namespaces"`
				} `json:"linux"`
			} `json:"runtimeSpec"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		return p, fmt.Errorf("decode inspectp %s: %w", p.Name, err)
	}
	p.IP = res.Status.Network.IP
	for _, ns := range res.Info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" {
			p.NetNS = ns.Path
		}
	}
	if p.IP == "" || p.NetNS == "" {
		return p, fmt.Errorf("inspectp %s: no address (%q) or network namespace (%q)", p.Name, p.IP, p.NetNS)
	}
	return p, nil
}

// StartContainer creates and starts a container of image in the pod,
// running args, and returns its ID.
func (c *Containerd) StartContainer(ctx context.Context, p Pod, name, image string, args ...string) (string, error) {
	podSpec := filepath.Join(c.cfg.Dir, p.Name+"-pod.json")
	spec, err := c.writeJSON(p.Name+"-"+name+".json", map[string]any{
		"metadata": map[string]any{"name": name},
		"image":    map[string]any{"image": image},
		"command":  args,
		"log_path": name + ".log",
		"linux":    map[string]any{},
	})
	if err != nil {
		return "", err
	}
	out, err := c.Crictl(ctx, "create", "--no-pull", p.ID, spec, podSpec)
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(out)
	if _, err := c.Crictl(ctx, "start", id); err != nil {
		return id, err
	}
	return id, nil
}

// Exec runs argv in a running container and returns its standard output.
func (c *Containerd) Exec(ctx context.Context, container string, argv ...string) (string, error) {
	return c.Crictl(ctx, append([]string{"exec", container}, argv...)...)
}

// RemovePod stops and removes a pod sandbox (the plugin's DEL runs on stop).
func (c *Containerd) RemovePod(ctx context.Context, p Pod) error {
	if _, err := c.Crictl(ctx, "stopp", p.ID); err != nil {
		return err
	}
	_, err := c.Crictl(ctx, "rmp", p.ID)
	return err
}

// RemoveStoppedPod removes a sandbox whose pod the kubelet stopped, as the
// kubelet's garbage collection would; a sandbox that collection removed
// first (crictl: NotFound) is gone already, which is what was asked.
func (c *Containerd) RemoveStoppedPod(ctx context.Context, p Pod) error {
	err := c.RemovePod(ctx, p)
	if err != nil && strings.Contains(err.Error(), "code = NotFound") {
		return nil
	}
	return err
}

func (c *Containerd) writeJSON(name string, v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", name, err)
	}
	path := filepath.Join(c.cfg.Dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return "", fmt.Errorf("write %s: %w", name, err)
	}
	return path, nil
}

// Stop removes every pod the runtime still has (so the plugin's DEL runs
// for each), stops containerd, ends any shim it left, unmounts what is
// mounted under Dir (root filesystems, shm, the pods' network namespaces),
// removes Dir and the cgroups runc made for its own sandboxes and containers
// (also those a kubelet started through it), never another containerd's: the
// labs of parallel tests run beside each other. It reports what it could not
// undo.
func (c *Containerd) Stop() error {
	var errs []error
	ids := c.ownIDs()
	select {
	case <-c.done:
	default:
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		for _, args := range [][]string{{"pods", "--quiet"}, {"ps", "--all", "--quiet"}} {
			if out, err := c.Crictl(ctx, args...); err == nil {
				for _, id := range strings.Fields(out) {
					ids[id] = true
				}
			}
		}
		if _, err := c.Crictl(ctx, "rmp", "--all", "--force"); err != nil {
			errs = append(errs, fmt.Errorf("remove pods: %w", err))
		}
		cancel()
		c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
			<-c.done
		}
	}
	// Shims run detached from containerd; each names our socket in its
	// command line, which tells them from any other runtime's.
	for _, pid := range c.shims() {
		if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
			errs = append(errs, fmt.Errorf("shim %d was still running after containerd stopped", pid))
		}
	}
	if err := unmountUnder(c.cfg.Dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.cfg.Dir); err != nil {
		errs = append(errs, fmt.Errorf("remove containerd dir: %w", err))
	}
	if err := removeCgroupsSince(c.cgroups, ids); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("stop containerd in %s: %w", c.cfg.NetNS, errors.Join(errs...))
	}
	return nil
}

// shims returns the pids of the shims serving this containerd.
func (c *Containerd) shims() []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	want := []byte("\x00-address\x00" + c.Socket() + "\x00")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, want) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// cgroupRoot holds the machine's cgroup hierarchies.
const cgroupRoot = "/sys/fs/cgroup"

// runtimeCgroups is the cgroup under each hierarchy in which runc puts the
// containers of containerd's CRI namespace (cgroupsPath /k8s.io/<id> when
// the kubelet gives no parent, as with cgroupsPerQOS: false).
const runtimeCgroups = "k8s.io"

// cgroupDirs returns the cgroup directories of the CRI namespace in every
// hierarchy. Nothing else is listed: other cgroups of the machine belong to
// whoever runs it.
func cgroupDirs() (map[string]bool, error) {
	dirs := map[string]bool{}
	tops, err := filepath.Glob(filepath.Join(cgroupRoot, "*", runtimeCgroups))
	if err != nil {
		return nil, fmt.Errorf("list cgroups: %w", err)
	}
	for _, top := range tops {
		err := filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				dirs[p] = true
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("list cgroups: %w", err)
		}
	}
	return dirs, nil
}

// ownIDs returns the ids of the sandboxes and containers this containerd
// keeps under Dir (the CRI plugin's and the runtime's directories, one per
// id), each the name of the cgroup runc made for it (k8s.io/<id>). Read from
// disk, so a containerd that died is covered too.
func (c *Containerd) ownIDs() map[string]bool {
	ids := map[string]bool{}
	for _, sub := range []string{
		"root/io.containerd.grpc.v1.cri/sandboxes", "root/io.containerd.grpc.v1.cri/containers",
		"state/io.containerd.grpc.v1.cri/sandboxes", "state/io.containerd.grpc.v1.cri/containers",
		"state/io.containerd.runtime.v2.task/" + runtimeCgroups,
	} {
		ents, _ := os.ReadDir(filepath.Join(c.cfg.Dir, sub))
		for _, e := range ents {
			if e.IsDir() {
				ids[e.Name()] = true
			}
		}
	}
	return ids
}

// cgroupID returns the sandbox or container id a cgroup directory of the CRI
// namespace belongs to (the first component under k8s.io/), "" for the
// namespace's own directory.
func cgroupID(dir string) string {
	_, rest, ok := strings.Cut(dir, "/"+runtimeCgroups+"/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// removeCgroupsSince removes the cgroup directories of the sandboxes and
// containers in ids that are not in before, deepest first, and the CRI
// namespace's own directory where it was not in before either and no other
// runtime's containers are left in it. A cgroup with a process left in it
// cannot be removed, and is reported.
func removeCgroupsSince(before, ids map[string]bool) error {
	now, err := cgroupDirs()
	if err != nil {
		return err
	}
	var added []string
	for d := range now {
		if id := cgroupID(d); !before[d] && (id == "" || ids[id]) {
			added = append(added, d)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(added))) // children sort after parents
	var errs []error
	for _, d := range added {
		err := syscall.Rmdir(d)
		if err == nil || errors.Is(err, syscall.ENOENT) || (cgroupID(d) == "" && errors.Is(err, syscall.EBUSY)) {
			continue // gone, or the namespace's directory, which another runtime still uses
		}
		errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
	}
	return errors.Join(errs...)
}

// unmountUnder unmounts every mount point under dir, deepest first.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mounts: %w", err)
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4]+"/", dir+"/") {
			points = append(points, fields[4])
		}
	}
	var errs []error
	for i := len(points) - 1; i >= 0; i-- {
		if err := syscall.Unmount(points[i], syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", points[i], err))
		}
	}
	return errors.Join(errs...)
}
