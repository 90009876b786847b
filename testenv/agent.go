package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// agent is an agent process this process started.
type agent struct {
	node string
	pid  int
	done chan struct{} // closed when the process has been reaped
}

// AgentLog returns the path of a node's agent log.
func (l *Lab) AgentLog(node string) string { return filepath.Join(l.StateDir(), node+".log") }

func (l *Lab) readyFile(node string) string { return filepath.Join(l.StateDir(), node+".ready") }
func pidFile(lab, node string) string       { return filepath.Join(StateDir(lab), node+".pid") }

// AgentArgs returns the command line (after nsenter) of a node's agent.
func (l *Lab) AgentArgs(node string, extra []string) []string {
	args := []string{l.Binary, "agent", "--node", node}
	if kc := l.Kubeconfig(); kc != "" {
		args = append(args, "--kubeconfig", kc)
	} else {
		args = append(args, "--objects", l.ObjectsDir())
	}
	args = append(args,
		"--underlay-dev", UnderlayDev,
		"--pin-dir", l.PinDir(node),
		"--pod-interfaces", l.Scenario.PodInterfaces(),
		"--ready-file", l.readyFile(node),
	)
	args = append(args, l.cniAgentArgs(node)...)
	args = append(args, l.wireGuardArgs(node)...)
	if l.Scenario.Decap != "" {
		args = append(args, "--decap", l.Scenario.Decap)
	}
	if l.Scenario.VNI != 0 {
		args = append(args, "--vni", strconv.FormatUint(uint64(l.Scenario.VNI), 10))
	}
	return append(args, extra...)
}

func (l *Lab) startAgents(ctx context.Context, opts Options) error {
	if err := ensureBPFFS(); err != nil {
		return err
	}
	for _, n := range l.Scenario.Nodes() {
		if err := os.MkdirAll(filepath.Dir(l.PinDir(n.Name)), 0o755); err != nil {
			return fmt.Errorf("create pin dir: %w", err)
		}
		if err := l.StartAgent(n.Name, opts.AgentArgs...); err != nil {
			return err
		}
	}
	if err := l.WaitReady(ctx, l.readyTimeout(opts)); err != nil {
		return err
	}
	// A new lab is ready once its agents also agree that every peer is up; a
	// test that restarts agents later decides for itself what to wait for.
	ctx, cancel := context.WithTimeout(ctx, l.readyTimeout(opts))
	defer cancel()
	return l.waitPeersUp(ctx)
}

// readyTimeout is Options.ReadyTimeout with its default, 60 s: in the parallel
// e2e phase a dozen agents load and verify the BPF object at once on two cores,
// and one took 27 s to get past it (1.8 s alone). An agent that never becomes
// ready still fails the wait.
func (l *Lab) readyTimeout(opts Options) time.Duration {
	if opts.ReadyTimeout == 0 {
		return 60 * time.Second
	}
	return opts.ReadyTimeout
}

// StartAgent starts the agent of a node, detached (its own session, output to
// AgentLog, pid in the state directory), with extra arguments appended. It
// removes a stale ready file first, so WaitReady waits for this run.
func (l *Lab) StartAgent(node string, extra ...string) error {
	if _, ok := l.Node(node); !ok {
		return fmt.Errorf("start agent: no node %q", node)
	}
	os.Remove(l.readyFile(node))
	logf, err := os.OpenFile(l.AgentLog(node), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open agent log: %w", err)
	}
	defer logf.Close()
	fmt.Fprintf(logf, "--- %s lab: starting agent\n", time.Now().Format(time.RFC3339))
	cmd := Command(context.Background(), l.NodeNS(node), l.AgentArgs(node, extra)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own session: the agent outlives `isthmus-lab lab up` and no terminal signal
	// reaches it; Down signals the whole group.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start agent on %s: %w", node, err)
	}
	a := &agent{node: node, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { cmd.Wait(); close(a.done) }()
	l.mu.Lock()
	l.agents[node] = a
	l.mu.Unlock()
	if err := os.WriteFile(pidFile(l.Name, node), []byte(strconv.Itoa(a.pid)+"\n"), 0o644); err != nil {
		return fmt.Errorf("write pid file: %w", err)
	}
	return nil
}

// WaitReady waits until every agent has written its ready file, and the nodes
// behind a NAT have made their WireGuard handshakes. It fails early when an agent
// exits, and names the missing nodes with their log tails.
func (l *Lab) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		var waiting []string
		for _, n := range l.Scenario.Nodes() {
			if _, err := os.Stat(l.readyFile(n.Name)); err == nil {
				continue
			}
			l.mu.Lock()
			a := l.agents[n.Name]
			l.mu.Unlock()
			if a != nil {
				select {
				case <-a.done:
					return fmt.Errorf("agent on %s exited before it was ready; log %s:\n%s", n.Name, l.AgentLog(n.Name), tail(l.AgentLog(n.Name), 20))
				default:
				}
			}
			waiting = append(waiting, n.Name)
		}
		if len(waiting) == 0 {
			if err := l.waitBehindNATHandshakes(ctx, timeout); err != nil {
				return err
			}
			l.logf("lab %s: all agents ready", l.Name)
			return nil
		}
		select {
		case <-ctx.Done():
			var b strings.Builder
			fmt.Fprintf(&b, "wait for agents %v: %v", waiting, ctx.Err())
			for _, n := range waiting {
				fmt.Fprintf(&b, "\n--- %s (%s):\n%s", n, l.AgentLog(n), tail(l.AgentLog(n), 20))
			}
			return errors.New(b.String())
		case <-tick.C:
		}
	}
}

// StopAgent stops a node's agent (SIGTERM to its group, SIGKILL after 5s) and
// waits until it is gone. The datapath stays in place, as the agent leaves it.
func (l *Lab) StopAgent(node string) error {
	l.mu.Lock()
	a := l.agents[node]
	l.mu.Unlock()
	return stopAgent(l.Name, node, a)
}

func stopAgent(lab, node string, a *agent) error {
	pf := pidFile(lab, node)
	data, err := os.ReadFile(pf)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read pid file: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return fmt.Errorf("read pid file %s: %w", pf, err)
	}
	// Only signal a process that is still this lab's agent: the pid may have
	// been reused since.
	pin := filepath.Join(PinRoot, lab, node)
	if cmdline, err := readCmdline(pid); err == nil && bytes.Contains(cmdline, []byte(pin+"\x00")) {
		gone := func() bool {
			if a != nil {
				select {
				case <-a.done:
					return true
				default:
					return false
				}
			}
			return syscall.Kill(pid, 0) != nil
		}
		syscall.Kill(-pid, syscall.SIGTERM)
		deadline := time.Now().Add(5 * time.Second)
		for !gone() && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if !gone() {
			syscall.Kill(-pid, syscall.SIGKILL)
			for i := 0; i < 100 && !gone(); i++ {
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
	if err := os.Remove(pf); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove pid file: %w", err)
	}
	return nil
}

// readCmdline reads a process's command line. A process that has just been
// started may read empty for a moment: the parent learns of the exec at its
// point of no return, before the kernel has set up the new arguments. Zombies
// read empty too, so the wait is short.
func readCmdline(pid int) ([]byte, error) {
	path := fmt.Sprintf("/proc/%d/cmdline", pid)
	for i := 0; ; i++ {
		cmdline, err := os.ReadFile(path)
		if err != nil || len(cmdline) > 0 || i == 50 {
			return cmdline, err
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ensureBPFFS mounts bpffs at /sys/fs/bpf unless one is there.
func ensureBPFFS() error {
	var st syscall.Statfs_t
	const bpfMagic = 0xcafe4a11
	if err := syscall.Statfs("/sys/fs/bpf", &st); err == nil && st.Type == bpfMagic {
		return nil
	}
	if err := os.MkdirAll("/sys/fs/bpf", 0o755); err != nil {
		return fmt.Errorf("create /sys/fs/bpf: %w", err)
	}
	if err := syscall.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs: %w", err)
	}
	return nil
}

// tail returns the last n lines of a file, or a note why it cannot.
func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	data, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
