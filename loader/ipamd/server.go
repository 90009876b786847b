package ipamd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/isthmus-dev/isthmus/loader/ipam"
	"github.com/isthmus-dev/isthmus/loader/objects"
)

// Defaults of Config.
const (
	DefaultVerifyInterval = 2 * time.Second
	DefaultLeakInterval   = time.Minute
	DefaultLeakGrace      = time.Minute
)

// Config configures a Server.
type Config struct {
	Node   string
	Socket string
	Store  ipam.Store
	// Snapshot returns the current objects (source.Source.Snapshot). It is
	// called from the server's own goroutine, every VerifyInterval; an error
	// (API unreachable, a bad file) keeps the last verdict in force.
	Snapshot    func() (*objects.Set, []objects.Warning, error)
	UnderlayMTU int
	// VerifyInterval, LeakInterval: 0 means the defaults. A reservation is a
	// leak when it is older than LeakGrace (an ADD still wiring its pod is
	// not), its network namespace is gone and its host interface too.
	VerifyInterval, LeakInterval, LeakGrace time.Duration
	// LinkExists reports whether a host interface exists; nil looks in the
	// network namespace of the calling thread.
	LinkExists func(name string) bool
	// OnReady, if set, runs each time the verdict turns ready (the first
	// verification, and after every time it failed), on the verifying
	// goroutine.
	OnReady func(Verdict)
	// OnVerify, if set, runs after every verification that read the objects
	// (every VerifyInterval), with its verdict, on the verifying goroutine:
	// the agent keeps the plugin and the conflist where they belong there.
	OnVerify func(Verdict)
	Log      *slog.Logger
}

// Server serves IPAM on a Unix socket. Its methods are safe for concurrent use.
type Server struct {
	cfg      Config
	mu       sync.Mutex
	verdict  Verdict
	verified time.Time
	lastErr  string
}

// Start takes the socket (failing if another live agent holds it), verifies
// once and serves until ctx is done. The returned channel receives the
// serving error (nil after a clean stop) once everything has stopped.
func Start(ctx context.Context, cfg Config) (*Server, <-chan error, error) {
	if cfg.VerifyInterval <= 0 {
		cfg.VerifyInterval = DefaultVerifyInterval
	}
	if cfg.LeakInterval <= 0 {
		cfg.LeakInterval = DefaultLeakInterval
	}
	if cfg.LeakGrace <= 0 {
		cfg.LeakGrace = DefaultLeakGrace
	}
	if cfg.LinkExists == nil {
		cfg.LinkExists = func(name string) bool { _, err := net.InterfaceByName(name); return err == nil }
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, verdict: Verdict{Reason: "podCIDRs not verified yet"}}
	ln, unlock, err := listen(cfg.Socket)
	if err != nil {
		return nil, nil, err
	}
	s.Verify()
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+ipam.PathAdd, s.handleAdd)
	mux.HandleFunc("GET "+ipam.PathStatus, func(w http.ResponseWriter, _ *http.Request) { reply(w, http.StatusOK, s.Status()) })
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Go(func() { s.loop(ctx) })
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		wg.Wait()
		os.Remove(cfg.Socket)
		unlock()
		errc <- err
	}()
	return s, errc, nil
}

// listen binds the socket under an flock on a file beside it: a second agent
// on the node fails instead of unlinking the first one's socket, and a stale
// socket left by a killed agent is replaced.
func listen(path string) (net.Listener, func(), error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, nil, fmt.Errorf("create socket dir: %w", err)
	}
	lf, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("open socket lock: %w", err)
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lf.Close()
		return nil, nil, fmt.Errorf("lock %s: another agent serves IPAM on it: %w", path, err)
	}
	os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		lf.Close()
		return nil, nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		lf.Close()
		return nil, nil, fmt.Errorf("chmod %s: %w", path, err)
	}
	return ln, func() { lf.Close() }, nil
}

func (s *Server) loop(ctx context.Context) {
	verify := time.NewTicker(s.cfg.VerifyInterval)
	defer verify.Stop()
	leaks := time.NewTicker(s.cfg.LeakInterval)
	defer leaks.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-verify.C:
			s.Verify()
		case <-leaks.C:
			if _, err := s.CollectLeaks(); err != nil {
				s.cfg.Log.Error("collect leaked reservations", "err", err)
			}
		}
	}
}

// Verify reads the objects and verifies the node's podCIDRs now. A failed
// read keeps the last verdict (an API outage does not stop a verified node).
func (s *Server) Verify() {
	set, _, err := s.cfg.Snapshot()
	if err != nil {
		s.mu.Lock()
		if s.lastErr != err.Error() {
			s.cfg.Log.Warn("ipam: objects unreadable, keeping the last verdict", "err", err, "ready", s.verdict.Ready())
		}
		s.lastErr = err.Error()
		s.mu.Unlock()
		return
	}
	v := Verify(set, s.cfg.Node, s.cfg.UnderlayMTU)
	s.mu.Lock()
	prev := s.verdict
	s.lastErr = ""
	s.verdict = v
	if v.Ready() {
		s.verified = time.Now()
	}
	s.mu.Unlock()
	if !sameVerdict(v, prev) {
		s.cfg.Log.Info("ipam: verdict", "ranges", v.Ranges, "mtu", v.MTU, "reason", v.Reason)
	}
	if v.Ready() && !prev.Ready() && s.cfg.OnReady != nil {
		s.cfg.OnReady(v)
	}
	if s.cfg.OnVerify != nil {
		s.cfg.OnVerify(v)
	}
}

func sameVerdict(a, b Verdict) bool {
	return a.Reason == b.Reason && a.Unmanaged == b.Unmanaged && a.MTU == b.MTU && fmt.Sprint(a.Ranges) == fmt.Sprint(b.Ranges)
}

// Status is what STATUS answers.
func (s *Server) Status() ipam.Status {
	s.mu.Lock()
	v, verified, lastErr := s.verdict, s.verified, s.lastErr
	s.mu.Unlock()
	st := ipam.Status{Ready: v.Ready(), Reason: v.Reason, Ranges: v.Ranges, MTU: v.MTU, Verified: verified}
	if !st.Ready && lastErr != "" {
		st.Reason += " (objects unreadable: " + lastErr + ")"
	}
	if have, err := s.cfg.Store.List(); err == nil {
		for _, r := range have {
			if !containedIn(v.Ranges, r.Addr) {
				st.Outside = append(st.Outside, r.Addr)
			}
		}
	}
	return st
}

func containedIn(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (s *Server) handleAdd(w http.ResponseWriter, r *http.Request) {
	var req ipam.AddRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil || req.ContainerID == "" || req.IfName == "" {
		reply(w, http.StatusBadRequest, ipam.Error{Code: ipam.CodeTryAgainLater, Msg: fmt.Sprintf("decode add request: want containerID and ifname (%v)", err)})
		return
	}
	s.mu.Lock()
	v := s.verdict
	s.mu.Unlock()
	if !v.Ready() {
		reply(w, http.StatusServiceUnavailable, ipam.Error{Code: ipam.CodeTryAgainLater, Msg: "isthmus ipam not ready: " + v.Reason})
		return
	}
	addrs, err := s.cfg.Store.Reserve(v.Ranges, req.IPs, ipam.Reservation{Attachment: req.Attachment, NetNS: req.NetNS,
		HostIface: req.HostIface, Created: time.Now()})
	if err != nil {
		reply(w, http.StatusServiceUnavailable, ipam.Error{Code: ipam.CodeTryAgainLater, Msg: "reserve address: " + err.Error()})
		return
	}
	resp := ipam.AddResponse{Ranges: v.Ranges, MTU: v.MTU}
	for _, a := range addrs {
		resp.Addrs = append(resp.Addrs, netip.PrefixFrom(a, a.BitLen()))
	}
	s.cfg.Log.Info("ipam: reserved", "container", req.ContainerID, "ifname", req.IfName, "addrs", addrs)
	reply(w, http.StatusOK, resp)
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

// CollectLeaks releases the reservations whose pods are gone: older than
// LeakGrace, network namespace path gone, host interface gone. A runtime that
// lost a pod without DEL (a crash, a node reboot that cleared /run) leaves
// exactly those.
func (s *Server) CollectLeaks() ([]ipam.Reservation, error) {
	now := time.Now()
	freed, err := s.cfg.Store.ReleaseIf(func(r ipam.Reservation) bool {
		if now.Sub(r.Created) < s.cfg.LeakGrace {
			return false
		}
		if r.NetNS != "" {
			if _, err := os.Stat(r.NetNS); !errors.Is(err, os.ErrNotExist) {
				return false
			}
		}
		return r.HostIface == "" || !s.cfg.LinkExists(r.HostIface)
	})
	for _, r := range freed {
		s.cfg.Log.Info("ipam: released leaked reservation", "addr", r.Addr, "container", r.ContainerID, "ifname", r.IfName)
	}
	return freed, err
}
