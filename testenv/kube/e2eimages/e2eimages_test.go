package e2eimages

// Kernel test: needs root (mmdebstrap the first time, network namespaces,
// containerd with runc); run it under the shared kernel lock
// (flock -o /tmp/isthmus-kernel.lock go test ./testenv/kube/e2eimages -run TestImagesRun).
// The first run builds e2e.test (kubebin, tens of minutes) and the agnhost
// image's Debian layer (a few minutes); later runs take about a minute.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/isthmus-dev/isthmus/testenv"
	"github.com/isthmus-dev/isthmus/testenv/cri"
	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// TestImagesRunInContainerd: the archives Build writes import into a private
// containerd in a network namespace of its own, under every agnhost and
// pause name the suite lists (read here from e2e.test --list-images, with a
// looser filter than Build's, so a name the suite asks for and Build does
// not make fails); with the suite's pause as the runtime's sandbox image a
// pod sandbox runs /pause (pause.c, its version the suite's tag, as uid
// 65535); agnhost netexec in that pod answers HTTP /hostname and UDP
// "hostname" from another namespace, across a veth, with the node's
// hostname (the kernel's, the pod being on the node's network); agnhost's
// image has the tools the suite execs in it.
func TestImagesRunInContainerd(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("e2e images test: needs root (mmdebstrap, network namespaces, containerd, runc); run as root under flock -o /tmp/isthmus-kernel.lock")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	e2eTest, err := kubebin.E2ETest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	crictl, err := kubebin.Crictl(ctx)
	if err != nil {
		t.Fatal(err)
	}
	archives, err := BuildWith(ctx, t.TempDir(), e2eTest, Options{Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}

	// The suite's names, read without this package's parser.
	listed, err := exec.CommandContext(ctx, e2eTest, "--list-images").Output()
	if err != nil {
		t.Fatalf("e2e.test --list-images: %v", err)
	}
	var want []string
	for _, line := range strings.Fields(string(listed)) {
		if strings.Contains(line, "agnhost") || strings.Contains(line, "pause") || strings.Contains(line, "glibc-dns") || strings.Contains(line, "/nginx:") {
			want = append(want, line)
		}
	}
	var pauseName string
	for _, a := range archives {
		if a.Image == Pause {
			pauseName = a.Names[0]
		}
	}
	if len(want) < 2 || pauseName == "" {
		t.Fatalf("the suite lists %q for agnhost and pause; archives %+v", want, archives)
	}

	// Two namespaces joined by a veth: the node's, where containerd and
	// the pod run, and a client's.
	id := os.Getpid() % 100000
	node, client := fmt.Sprintf("ise2n%d", id), fmt.Sprintf("ise2c%d", id)
	for _, ns := range []string{node, client} {
		if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v\n%s", ns, err, out)
		}
		t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	}
	for _, args := range [][]string{
		{"link", "add", "e2en", "netns", node, "type", "veth", "peer", "name", "e2ec", "netns", client},
		{"-n", node, "addr", "add", "192.0.2.1/24", "dev", "e2en"},
		{"-n", client, "addr", "add", "192.0.2.2/24", "dev", "e2ec"},
		{"-n", node, "link", "set", "e2en", "up"},
		{"-n", client, "link", "set", "e2ec", "up"},
		{"-n", node, "link", "set", "lo", "up"},
		{"-n", client, "link", "set", "lo", "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	dir, err := os.MkdirTemp("", "ise2i-")
	if err != nil {
		t.Fatal(err)
	}
	c, err := cri.Start(ctx, cri.Config{Dir: dir, NetNS: "/run/netns/" + node, CNIBinDir: filepath.Join(dir, "cni-bin"),
		CNIConfDir: filepath.Join(dir, "cni-conf"), Crictl: crictl, SandboxImage: pauseName})
	if c != nil {
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range archives {
		if err := c.Import(ctx, a.Path); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range want {
		if out, err := c.Crictl(ctx, "inspecti", name); err != nil {
			t.Errorf("the suite asks for %s, which the archives do not hold: %v\n%s", name, err, out)
		}
	}

	p, err := c.RunHostNetworkPod(ctx, "netexec")
	if err != nil {
		t.Fatalf("%v\n%s", err, c.LogTail())
	}
	// The sandbox's process: the suite's pause, not the tests' Go one.
	out, err := c.Crictl(ctx, "inspectp", p.ID)
	if err != nil {
		t.Fatal(err)
	}
	var sandbox struct {
		Info struct {
			Pid   int    `json:"pid"`
			Image string `json:"image"`
		} `json:"info"`
	}
	if err := json.Unmarshal([]byte(out), &sandbox); err != nil || sandbox.Info.Pid == 0 {
		t.Fatalf("crictl inspectp: pid %d, %v\n%s", sandbox.Info.Pid, err, out)
	}
	if sandbox.Info.Image != "" && sandbox.Info.Image != pauseName {
		t.Errorf("sandbox image %q, want %q", sandbox.Info.Image, pauseName)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", sandbox.Info.Pid))
	if err != nil || string(cmdline) != "/pause\x00" {
		t.Errorf("sandbox process %d runs %q (%v), want /pause", sandbox.Info.Pid, cmdline, err)
	}
	if uid := procUID(t, sandbox.Info.Pid); uid != "65535" {
		t.Errorf("sandbox process %d runs as uid %s, want the image's 65535", sandbox.Info.Pid, uid)
	}
	tag := pauseName[strings.LastIndexByte(pauseName, ':')+1:]
	if v, err := exec.CommandContext(ctx, "nsenter", "--mount=/proc/"+strconv.Itoa(sandbox.Info.Pid)+"/ns/mnt", "/pause", "-v").CombinedOutput(); err != nil ||
		strings.TrimSpace(string(v)) != "pause.c v"+tag {
		t.Errorf("/pause -v in the sandbox: %q, %v; want \"pause.c v%s\"", v, err, tag)
	}

	const httpPort, udpPort = 8080, 8081
	srv, err := c.StartContainer(ctx, p, "netexec", archives[0].Names[0], "/agnhost", "netexec",
		"--http-port="+strconv.Itoa(httpPort), "--udp-port="+strconv.Itoa(udpPort))
	if err != nil {
		t.Fatalf("%v\n%s", err, c.LogTail())
	}
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	var gotHTTP, gotUDP string
	err = testenv.Do(client, func() error {
		// Sockets made on this thread are the client namespace's; an
		// http.Client would dial on another goroutine, in the host's.
		get := func() (string, error) {
			conn, err := net.DialTimeout("tcp", fmt.Sprintf("192.0.2.1:%d", httpPort), 2*time.Second)
			if err != nil {
				return "", err
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			req, err := http.NewRequest("GET", fmt.Sprintf("http://192.0.2.1:%d/hostname", httpPort), nil)
			if err != nil {
				return "", err
			}
			if err := req.Write(conn); err != nil {
				return "", err
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), req)
			if err != nil {
				return "", err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("status %s: %s", resp.Status, b)
			}
			return string(b), err
		}
		var err error
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			if gotHTTP, err = get(); err == nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("HTTP /hostname: %w", err)
		}
		conn, err := net.Dial("udp", fmt.Sprintf("192.0.2.1:%d", udpPort))
		if err != nil {
			return err
		}
		defer conn.Close()
		buf := make([]byte, 1024)
		for i := 0; i < 10; i++ {
			if _, err = conn.Write([]byte("hostname")); err != nil {
				return err
			}
			conn.SetReadDeadline(time.Now().Add(time.Second))
			var n int
			if n, err = conn.Read(buf); err == nil {
				gotUDP = string(buf[:n])
				return nil
			}
		}
		return fmt.Errorf("UDP hostname: %w", err)
	})
	if err != nil {
		ps, _ := c.Crictl(ctx, "ps", "-a")
		state, _ := c.Crictl(ctx, "inspect", "-o", "go-template", "--template", "{{.status.state}} {{.status.exitCode}} {{.status.reason}} {{.status.message}}", srv)
		logs, _ := c.Crictl(ctx, "logs", srv)
		sockets, _ := c.Exec(ctx, srv, "sh", "-c", "tr '\\0' ' ' </proc/1/cmdline; echo; ip -br addr; ss -ltnup")
		t.Fatalf("%v\ncontainers:\n%s\nnetexec: %s\nnetexec's log:\n%s\nin the container:\n%s", err, ps, state, logs, sockets)
	}
	if strings.TrimSpace(gotHTTP) != hostname || strings.TrimSpace(gotUDP) != hostname {
		t.Errorf("netexec answered HTTP %q, UDP %q; want the node's hostname %q", gotHTTP, gotUDP, hostname)
	}

	// The tools the suite runs in agnhost pods (kubectl exec ... sh -c).
	tools, err := c.Exec(ctx, srv, "sh", "-c", "for p in curl nc dig ip ss iperf bash socat ipcs; do command -v $p || exit 1; done; test -x /agnhost-2 && test -d /uploads && id user-defined-in-image")
	if err != nil {
		t.Errorf("tools in agnhost: %v\n%s", err, tools)
	} else if !strings.Contains(tools, "uid=1000(user-defined-in-image)") || !strings.Contains(tools, "50000(group-defined-in-image)") {
		t.Errorf("agnhost's user-defined-in-image: %s", tools)
	}
	// The tools are not vacuous: a program the image lacks is not found.
	if out, err := c.Exec(ctx, srv, "sh", "-c", "command -v wget"); err == nil {
		t.Errorf("agnhost has wget, which nothing installs: %s", out)
	}

	names := map[string]string{}
	for _, a := range archives {
		names[a.Image] = a.Names[0]
	}
	// The DNS cases' glibc querier: dig, and glibc's getent reading
	// /etc/hosts.
	glibc, err := c.StartContainer(ctx, p, "glibc", names[GlibcDNSTesting], "sleep", "600")
	if err != nil {
		t.Fatalf("%v\n%s", err, c.LogTail())
	}
	if out, err := c.Exec(ctx, glibc, "sh", "-c", "command -v dig && getent hosts localhost"); err != nil || !strings.Contains(out, "127.0.0.1") && !strings.Contains(out, "::1") {
		t.Errorf("glibc-dns-testing: dig and getent hosts localhost: %q, %v", out, err)
	}
	// nginx as its image starts it (no command given) serves HTTP on port 80.
	if _, err := c.StartContainer(ctx, p, "nginx", names[Nginx]); err != nil {
		t.Fatalf("%v\n%s", err, c.LogTail())
	}
	var server string
	err = testenv.Do(client, func() error {
		var err error
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			var conn net.Conn
			if conn, err = net.DialTimeout("tcp", "192.0.2.1:80", 2*time.Second); err != nil {
				continue
			}
			conn.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(conn, "GET / HTTP/1.0\r\n\r\n")
			var resp *http.Response
			resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
			conn.Close()
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("status %s", resp.Status)
				}
				server = resp.Header.Get("Server")
				return nil
			}
		}
		return err
	})
	if err != nil || !strings.HasPrefix(server, "nginx") {
		t.Errorf("nginx on port 80: Server %q, %v", server, err)
	}
}

// procUID returns the real uid of a process, from /proc.
func procUID(t *testing.T, pid int) string {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 1 && f[0] == "Uid:" {
			return f[1]
		}
	}
	return ""
}
