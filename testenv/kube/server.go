// Package kube runs a real kube-apiserver and etcd on loopback for tests: the
// binaries build from the Go module proxy in a separate module (tools/, so the
// main module never depends on k8s.io/kubernetes) and are cached between runs.
// A Server has token authentication (an admin in system:masters), RBAC
// authorization, the default admission plugins and its own serving
// certificates; it installs the CRDs of deploy/crds and applies manifests with
// server-side dry run.
package kube

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/isthmus-dev/isthmus/testenv/kube/kubebin"
)

// AdminUser is the user of the admin token, in group system:masters.
const AdminUser = "isthmus-admin"

// The Services' addresses: the API server's --service-cluster-ip-range,
// kubeadm's default, and the two addresses a cluster reserves in it as
// kubeadm does.
var (
	// ServiceCIDR is the range of every Service's ClusterIP.
	ServiceCIDR = netip.MustParsePrefix("10.96.0.0/16")
	// APIServiceIP is the ClusterIP of the default/kubernetes Service (the
	// first address of ServiceCIDR, which the API server takes for it): in
	// the serving certificate, so that pods reach the API server through it.
	APIServiceIP = netip.MustParseAddr("10.96.0.1")
	// ClusterDNSIP is the ClusterIP of kube-system/kube-dns, the cluster DNS
	// every kubelet hands its pods (kubeadm's: the tenth address).
	ClusterDNSIP = netip.MustParseAddr("10.96.0.10")
)

// ClusterDomain is the cluster's DNS domain, kubeadm's default.
const ClusterDomain = "cluster.local"

// Options tune Start.
type Options struct {
	// Log receives the output of etcd and kube-apiserver as well as the files in
	// the server's directory; nil keeps it only in those files.
	Log io.Writer
	// ReadyTimeout bounds the wait for /readyz; default 2 minutes.
	ReadyTimeout time.Duration
	// ClusterEgress, when set, is a unix socket path: the API server sends
	// its traffic to the cluster (kubelets for exec, logs and port-forward,
	// and the proxy subresources of nodes, pods and Services) through an HTTP
	// CONNECT proxy listening there (an EgressSelectorConfiguration of type
	// cluster), which the caller serves. The lab's nodes live in network
	// namespaces the host cannot reach; the proxy dials from inside them.
	ClusterEgress string
}

// Server is a running etcd and kube-apiserver on 127.0.0.1. Its methods are
// safe to call from several goroutines.
type Server struct {
	dir       string // certificates, tokens, kubeconfig, logs, etcd data
	apiserver string // binary
	etcdBin   string
	apiPort   int
	etcdURL   string
	token     string
	caPEM     []byte
	log       io.Writer
	timeout   time.Duration
	egress    string // Options.ClusterEgress

	mu   sync.Mutex
	etcd *Process
	api  *Process
}

// Process is a child process (Spawn, the server's own) and the channel closed when
// it has been reaped.
type Process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start builds or finds the binaries (see kubebin.Binaries), starts etcd and
// kube-apiserver on free loopback ports in a new temporary directory, waits
// until /readyz answers ok and writes a kubeconfig for the admin user. On
// error nothing is left running. The caller must call Stop; the child
// processes also die with the calling process (SIGKILL on parent death).
func Start(ctx context.Context, opts Options) (*Server, error) {
	apiserver, etcd, err := kubebin.Binaries(ctx)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "isthmus-kube-")
	if err != nil {
		return nil, fmt.Errorf("create server dir: %w", err)
	}
	s := &Server{dir: dir, apiserver: apiserver, etcdBin: etcd, log: opts.Log, timeout: opts.ReadyTimeout, egress: opts.ClusterEgress}
	if s.timeout == 0 {
		s.timeout = 2 * time.Minute
	}
	if err := s.start(ctx); err != nil {
		if serr := s.Stop(); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	s.apiPort = ports[0]
	s.etcdURL = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[2])
	if err := s.writeCredentials(); err != nil {
		return err
	}
	etcd, err := s.spawn("etcd", s.etcdBin,
		"--name=default",
		"--data-dir="+filepath.Join(s.dir, "etcd"),
		"--listen-client-urls="+s.etcdURL,
		"--advertise-client-urls="+s.etcdURL,
		"--listen-peer-urls="+peerURL,
		"--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=default="+peerURL,
		"--log-level=warn",
		"--unsafe-no-fsync=true", // a test cluster: durability across a machine crash is not needed
	)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.etcd = etcd
	s.mu.Unlock()
	if err := s.waitHTTP(ctx, etcd, s.etcdURL+"/health", nil); err != nil {
		return err
	}
	return s.StartAPIServer(ctx)
}

// StartAPIServer starts kube-apiserver on the server's port and etcd and waits
// until it is ready. Start calls it; tests call it after StopAPIServer to end
// an outage: the new process serves the same data on the same address.
func (s *Server) StartAPIServer(ctx context.Context) error {
	s.mu.Lock()
	running := s.api != nil
	s.mu.Unlock()
	if running {
		return errors.New("start kube-apiserver: already running")
	}
	p := func(name string) string { return filepath.Join(s.dir, name) }
	args := []string{
		"--etcd-servers=" + s.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.apiPort),
		"--cert-dir=" + p("certs"),
		"--tls-cert-file=" + p("serving.crt"),
		"--tls-private-key-file=" + p("serving.key"),
		"--token-auth-file=" + p("tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-key-file=" + p("sa.pub"),
		"--service-account-signing-key-file=" + p("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=" + ServiceCIDR.String(),
		"--allow-privileged=true", // the agent DaemonSet is privileged
		"--endpoint-reconciler-type=none",
		// What it presents to kubelets (exec, logs): a kubelet that trusts
		// CAFile as its client CA lets it in.
		"--kubelet-client-certificate=" + p("kubelet-client.crt"),
		"--kubelet-client-key=" + p("kubelet-client.key"),
		// A kubelet by its Node's InternalIP, as kubeadm configures it: the
		// lab's node names resolve nowhere.
		"--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
		"--v=1",
	}
	if s.egress != "" {
		cfg := p("egress-selector.yaml")
		if err := os.WriteFile(cfg, []byte(egressSelectorYAML(s.egress)), 0o644); err != nil {
			return fmt.Errorf("write egress selector configuration: %w", err)
		}
		args = append(args, "--egress-selector-config-file="+cfg)
	}
	api, err := s.spawn("kube-apiserver", s.apiserver, args...)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.api = api
	s.mu.Unlock()
	tlsConf, err := s.tlsConfig()
	if err != nil {
		return err
	}
	return s.waitHTTP(ctx, api, s.URL()+"/readyz", tlsConf)
}

// StopAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 10s) and leaves
// etcd running, for outage tests.
func (s *Server) StopAPIServer() error {
	s.mu.Lock()
	api := s.api
	s.api = nil
	s.mu.Unlock()
	return api.stop()
}

// Stop stops kube-apiserver and etcd and removes the server's directory. It
// is idempotent.
func (s *Server) Stop() error {
	s.mu.Lock()
	api, etcd := s.api, s.etcd
	s.api, s.etcd = nil, nil
	s.mu.Unlock()
	err := errors.Join(api.stop(), etcd.stop())
	if s.dir != "" {
		if rerr := os.RemoveAll(s.dir); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove server dir: %w", rerr))
		}
	}
	return err
}

// URL returns the API server's address, https://127.0.0.1:<port>.
func (s *Server) URL() string { return fmt.Sprintf("https://127.0.0.1:%d", s.apiPort) }

// Port returns the API server's port on 127.0.0.1.
func (s *Server) Port() int { return s.apiPort }

// Dir returns the server's directory (logs apiserver.log and etcd.log,
// certificates, kubeconfig).
func (s *Server) Dir() string { return s.dir }

// CAFile returns the path of the CA that signed the serving certificate and
// the API server's kubelet client certificate.
func (s *Server) CAFile() string { return filepath.Join(s.dir, "ca.crt") }

// egressSelectorYAML is the EgressSelectorConfiguration that sends the API
// server's cluster traffic through an HTTP CONNECT proxy on the unix socket
// sock (Options.ClusterEgress).
func egressSelectorYAML(sock string) string {
	return fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      uds:
        udsName: %s
`, strconv.Quote(sock))
}

// Kubeconfig returns the path of a kubeconfig for the admin user.
func (s *Server) Kubeconfig() string { return filepath.Join(s.dir, "kubeconfig") }

// RESTConfig returns a client configuration for the admin user.
func (s *Server) RESTConfig() *rest.Config {
	return &rest.Config{
		Host:            s.URL(),
		BearerToken:     s.token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.caPEM},
		QPS:             100,
		Burst:           200,
	}
}

// KubeconfigFor returns a kubeconfig (YAML) for the admin user that reaches
// the server at url (for a proxy in another network namespace); the serving
// certificate holds 127.0.0.1 and localhost only.
func (s *Server) KubeconfigFor(url string) ([]byte, error) {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["isthmus-test"] = &clientcmdapi.Cluster{Server: url, CertificateAuthorityData: s.caPEM}
	cfg.AuthInfos[AdminUser] = &clientcmdapi.AuthInfo{Token: s.token}
	cfg.Contexts["isthmus-test"] = &clientcmdapi.Context{Cluster: "isthmus-test", AuthInfo: AdminUser}
	cfg.CurrentContext = "isthmus-test"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return nil, fmt.Errorf("render kubeconfig: %w", err)
	}
	return data, nil
}

func (s *Server) tlsConfig() (*tls.Config, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(s.caPEM) {
		return nil, errors.New("load test CA: no certificate")
	}
	return &tls.Config{RootCAs: pool}, nil
}

// spawn starts a child with output to <name>.log in the server's directory
// (and to the Log writer), in its own process group, killed if we die.
func (s *Server) spawn(name, bin string, args ...string) (*Process, error) {
	return spawnLogged(name, filepath.Join(s.dir, name+".log"), s.log, bin, args...)
}

// Spawn starts bin with args, output appended to logPath, in its own process
// group, killed (SIGKILL) if this process dies. Stop ends it.
func Spawn(name, logPath, bin string, args ...string) (*Process, error) {
	return spawnLogged(name, logPath, nil, bin, args...)
}

// Stop ends the process (SIGTERM, then SIGKILL after 10s) and reaps it. It is
// idempotent.
func (p *Process) Stop() error { return p.stop() }

// Done is closed once the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// spawnLogged is Spawn with the output also copied to extra (when not nil).
func spawnLogged(name, logPath string, extra io.Writer, bin string, args ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	var out io.Writer = logf
	if extra != nil {
		out = io.MultiWriter(logf, extra)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p := &Process{name: name, cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	// Pdeathsig fires when the thread that forked the child exits, not the
	// process: fork from a locked thread that lives until the child is reaped,
	// so no other goroutine's thread retirement kills the server.
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	if err := <-started; err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// stop ends the process (SIGTERM, then SIGKILL after 10s) and reaps it. A nil
// process is already stopped.
func (p *Process) stop() error {
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("stop %s (pid %d): still running after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// waitHTTP polls url until it answers 200, the process exits, or the timeout.
func (s *Server) waitHTTP(ctx context.Context, p *Process, url string, tlsConf *tls.Config) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConf}}
	defer client.CloseIdleConnections()
	var last string
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if s.token != "" {
			req.Header.Set("Authorization", "Bearer "+s.token)
		}
		resp, err := client.Do(req)
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Sprintf("%s: %s", resp.Status, kubebin.TailLines(string(body), 10))
		} else {
			last = err.Error()
		}
		select {
		case <-p.done:
			return fmt.Errorf("start %s: exited (%v) before %s answered; log %s:\n%s", p.name, p.err, url,
				filepath.Join(s.dir, p.name+".log"), tailFile(filepath.Join(s.dir, p.name+".log"), 30))
		case <-ctx.Done():
			return fmt.Errorf("wait for %s: %s not ready after %s (last: %s); log:\n%s", p.name, url, s.timeout, last,
				tailFile(filepath.Join(s.dir, p.name+".log"), 30))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return kubebin.TailLines(string(data), n)
}
